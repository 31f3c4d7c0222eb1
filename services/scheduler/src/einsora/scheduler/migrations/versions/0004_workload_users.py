"""Workloads keep the user who launched them: a machine invitation may name a user (issue 15).

The scheduler decides an invited user's trust on a machine by it. A workload stored before
this revision has no user: only its tenant's invitations count for it, as before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.add_column(sa.Column("user_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.drop_column("user_id")
