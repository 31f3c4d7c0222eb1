"""Fallback chains and region hand-overs (issue 20, ADR-0022).

A workload keeps the class it was placed as (`placed_class`, which accounting meters) and its
fallback chain with how far its admission has gone (`fallback`, JSON; null: none). An intent
handed to another region's scheduler is stored with the decision (`scheduler_handoffs`) and
forgotten once published, like the events' outbox. A workload stored before this revision has
neither: it was placed as its own class.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.add_column(sa.Column("placed_class", sa.String(64), nullable=True))
        batch.add_column(sa.Column("fallback", sa.Text, nullable=True))
    op.create_table(
        "scheduler_handoffs",
        sa.Column("intent_id", sa.String(64), primary_key=True),
        sa.Column("workload_id", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_handoffs")
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.drop_column("fallback")
        batch.drop_column("placed_class")
