"""A direct machine is reached at the address it was enrolled with (issue 34, N1; ADR-0026).

A join token for machines reached directly (`tunnel` false) may name the address its machine
joins from, and says whether the operator made it; a machine that joined directly keeps the
address it joined from. A direct machine that joined before this has none: its routes are refused
until it joins again.
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"


def upgrade() -> None:
    with op.batch_alter_table("join_tokens") as batch:
        batch.add_column(sa.Column("address", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column("by_operator", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("machines") as batch:
        batch.add_column(sa.Column("address", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("address")
    with op.batch_alter_table("join_tokens") as batch:
        batch.drop_column("by_operator")
        batch.drop_column("address")
