"""The owner's lend: what Einsora may use of each machine's cores, memory and GPUs (issue 15)."""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    # NULL everywhere: the whole inventory, what every machine enrolled before lent.
    with op.batch_alter_table("machines") as batch:
        batch.add_column(sa.Column("lend_cpus", sa.Float(), nullable=True))
        batch.add_column(sa.Column("lend_memory_mib", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("lend_gpus", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("lend_gpus")
        batch.drop_column("lend_memory_mib")
        batch.drop_column("lend_cpus")
