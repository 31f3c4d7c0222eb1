"""Machine invitations: a machine's owner invites a tenant, whose admin accepts (issue 15)."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0009"
down_revision = "0008"

ID = sa.String(32)
LIVE = "revoked_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "machine_invitations",
        sa.Column("id", ID),
        sa.Column("machine_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("invited_by", ID, nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("accepted_at", UtcDateTime(), nullable=True),
        sa.Column("accepted_by", ID, nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_machine_invitations"),
        sa.ForeignKeyConstraint(
            ["machine_id"], ["machines.id"], name="fk_machine_invitations_machine_id_machines"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_machine_invitations_tenant_id_tenants"
        ),
        sa.ForeignKeyConstraint(
            ["invited_by"], ["users.id"], name="fk_machine_invitations_invited_by_users"
        ),
        sa.ForeignKeyConstraint(
            ["accepted_by"], ["users.id"], name="fk_machine_invitations_accepted_by_users"
        ),
    )
    op.create_index(
        "ix_machine_invitations_machine_id_id", "machine_invitations", ["machine_id", "id"]
    )
    op.create_index(
        "ix_machine_invitations_tenant_id_id", "machine_invitations", ["tenant_id", "id"]
    )
    op.create_index(
        "uq_machine_invitations_live",
        "machine_invitations",
        ["machine_id", "tenant_id"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_machine_invitations_live", table_name="machine_invitations")
    op.drop_index("ix_machine_invitations_tenant_id_id", table_name="machine_invitations")
    op.drop_index("ix_machine_invitations_machine_id_id", table_name="machine_invitations")
    op.drop_table("machine_invitations")
