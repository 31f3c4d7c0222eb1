"""Each region's leader term, the fence of the scheduler's store (issue 19, ADR-0021).

A scheduler that takes its region's lease in KV raises the term here before it loads the book,
and every cycle's commit checks it still holds that term: a deposed leader (paused, partitioned)
can commit no decision once a standby has taken over.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_table(
        "scheduler_leases",
        sa.Column("region", sa.String(64), primary_key=True),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.String(128), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_leases")
