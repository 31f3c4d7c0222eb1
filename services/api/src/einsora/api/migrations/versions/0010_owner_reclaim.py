"""Owner reclaim: each machine's grace, guests' minimum runtime and reclaim time (issue 15)."""

import sqlalchemy as sa
from alembic import op

from einsora.store import UtcDateTime

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.add_column(
            sa.Column("reclaim_grace_s", sa.Float(), nullable=False, server_default="120")
        )
        batch.add_column(
            sa.Column("guest_min_runtime_s", sa.Float(), nullable=False, server_default="600")
        )
        batch.add_column(sa.Column("reclaimed_at", UtcDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("reclaimed_at")
        batch.drop_column("guest_min_runtime_s")
        batch.drop_column("reclaim_grace_s")
