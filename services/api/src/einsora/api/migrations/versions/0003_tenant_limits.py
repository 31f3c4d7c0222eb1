"""Tenant limits: the operator's cap on a tenant's workloads that are not removed."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0003"
down_revision = "0002"

ID = sa.String(32)


def upgrade() -> None:
    op.create_table(
        "tenant_limits",
        sa.Column("tenant_id", ID),
        sa.Column("max_workloads", sa.Integer(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_tenant_limits"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_tenant_limits_tenant_id_tenants"
        ),
    )
