"""Workloads keep their names: an endpoint's name is its model name (issue 12).

The scheduler writes it into each machine's desired state (the runtime serves the model under
it) and into the workload's route (the gateway routes `model` by it). A workload stored before
this revision has an empty name until the api sends it again (an endpoint then has no model
name to be routed by, which only endpoints launched after this revision need).
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.add_column(sa.Column("name", sa.String(128), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_workloads") as batch:
        batch.drop_column("name")
