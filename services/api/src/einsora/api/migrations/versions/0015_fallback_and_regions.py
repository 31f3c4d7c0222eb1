"""Fallback chains and region hand-overs (issue 20, ADR-0022).

A workload keeps how long it waits at one step of its fallback chain before the next
(`fallback_after_s`; its `fallback` column, a JSON list, now holds steps such as
`{"class": "a100-80gb"}`), and the region whose scheduler holds it now (`current_region`:
NULL until a region step hands it over; its intents go there).
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"

NAME = sa.String(64)


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(
            sa.Column("fallback_after_s", sa.Float(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("current_region", NAME, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("current_region")
        batch.drop_column("fallback_after_s")
