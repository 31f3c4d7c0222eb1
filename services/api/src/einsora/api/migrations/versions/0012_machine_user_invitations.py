"""Machine invitations may name a user instead of a tenant (issue 15).

An invited user accepts it themself, and their workloads may use the machine whatever tenant
they launch in. Every invitation made before names a tenant, so the check holds for them.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"

ID = sa.String(32)
LIVE = "revoked_at IS NULL"


def upgrade() -> None:
    with op.batch_alter_table("machine_invitations") as batch:
        batch.alter_column("tenant_id", existing_type=ID, nullable=True)
        batch.add_column(sa.Column("user_id", ID, nullable=True))
        batch.create_foreign_key(
            "fk_machine_invitations_user_id_users", "users", ["user_id"], ["id"]
        )
        batch.create_check_constraint(
            "ck_machine_invitations_one_guest", "(tenant_id IS NULL) <> (user_id IS NULL)"
        )
    op.create_index("ix_machine_invitations_user_id_id", "machine_invitations", ["user_id", "id"])
    op.create_index(
        "uq_machine_invitations_live_user",
        "machine_invitations",
        ["machine_id", "user_id"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_machine_invitations_live_user", table_name="machine_invitations")
    op.drop_index("ix_machine_invitations_user_id_id", table_name="machine_invitations")
    op.execute("DELETE FROM machine_invitations WHERE tenant_id IS NULL")
    with op.batch_alter_table("machine_invitations") as batch:
        batch.drop_constraint("ck_machine_invitations_one_guest", type_="check")
        batch.drop_constraint("fk_machine_invitations_user_id_users", type_="foreignkey")
        batch.drop_column("user_id")
        batch.alter_column("tenant_id", existing_type=ID, nullable=False)
