"""Access tickets: one-time links to a workload's site (only their hash is stored)."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0002"
down_revision = "0001"

ID = sa.String(32)


def upgrade() -> None:
    op.create_table(
        "access_tickets",
        sa.Column("id", ID),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("workload_id", ID, nullable=False),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("redeemed_at", UtcDateTime(), nullable=True),
        sa.Column("mint_request_id", sa.String(64), nullable=False),
        sa.Column("redeem_request_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_access_tickets"),
        sa.UniqueConstraint("secret_sha256", name="uq_access_tickets_secret_sha256"),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name="fk_access_tickets_workload_id_workloads"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_access_tickets_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_access_tickets_user_id_users"),
    )
    op.create_index("ix_access_tickets_workload_id", "access_tickets", ["workload_id"])
