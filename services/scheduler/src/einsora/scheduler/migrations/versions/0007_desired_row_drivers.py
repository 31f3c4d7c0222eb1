"""Each desired row names the driver chosen for it on its machine (issue 21).

A machine may now run workloads through several drivers (process, docker, libvirt); the
placement picks one and the agent runs the workload with it. A row stored before this
revision has none: the agent runs it with its default driver, as before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    with op.batch_alter_table("scheduler_desired_rows") as batch:
        batch.add_column(sa.Column("driver", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_desired_rows") as batch:
        batch.drop_column("driver")
