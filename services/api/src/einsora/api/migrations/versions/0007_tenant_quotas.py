"""Tenant quotas: the operator's limits on a tenant's GPUs and GPU-hours (issue 13)."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0007"
down_revision = "0006"

ID = sa.String(32)


def upgrade() -> None:
    op.create_table(
        "tenant_quotas",
        sa.Column("tenant_id", ID),
        sa.Column("max_gpus", sa.Text(), nullable=False),
        sa.Column("max_gpus_total", sa.Integer(), nullable=True),
        sa.Column("gpu_hours_per_7d", sa.Float(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_tenant_quotas"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_tenant_quotas_tenant_id_tenants"
        ),
    )


def downgrade() -> None:
    op.drop_table("tenant_quotas")
