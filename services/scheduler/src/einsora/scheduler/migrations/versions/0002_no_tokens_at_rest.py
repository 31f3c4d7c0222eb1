"""Workload tokens are no longer stored: they are derived from a key in the data dir.

Issue 9, hole 5: `scheduler_workloads.access_token` held every notebook's Jupyter token in
clear. The token is now HMAC-SHA256 of the workload id under `workload-tokens.key` (0600),
so the column goes. A workload placed before this revision gets a new token on its next
desired state, which its agent applies when it next starts it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.drop_column("access_token")


def downgrade() -> None:
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.add_column(
            sa.Column("access_token", sa.String(128), nullable=False, server_default="")
        )
