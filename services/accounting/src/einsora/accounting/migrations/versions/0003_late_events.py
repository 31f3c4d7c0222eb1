"""Accounting keeps each workload's applied transitions, so a late event is metered in place.

Issue 35: accounting killed holding a workload's `running`, then applying its `parking` and
`parked`, used to turn the redelivered `running` away as older than what it had applied, and
the stretch went unmetered. A processed event now keeps its `seq`, state, `at` and (for a
metered state) what it held; an allocation keeps the `seq` of the events that opened and closed
it; and a workload keeps `recorded_from`, the `seq` after which every applied transition is
kept. Workloads metered before this revision keep theirs from their last applied `seq`: what
came before is not known event by event, so a late event from then is turned away as before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

INDEX = "ux_accounting_processed_events_workload_seq"


def upgrade() -> None:
    utc = sa.DateTime(timezone=True)
    op.add_column("accounting_processed_events", sa.Column("seq", sa.BigInteger, nullable=True))
    op.add_column("accounting_processed_events", sa.Column("state", sa.String(16), nullable=True))
    op.add_column("accounting_processed_events", sa.Column("at", utc, nullable=True))
    op.add_column("accounting_processed_events", sa.Column("metered", sa.Text, nullable=True))
    op.create_index(INDEX, "accounting_processed_events", ["workload_id", "seq"], unique=True)
    op.add_column("accounting_allocations", sa.Column("opened_seq", sa.BigInteger, nullable=True))
    op.add_column("accounting_allocations", sa.Column("closed_seq", sa.BigInteger, nullable=True))
    op.add_column(
        "accounting_workloads",
        sa.Column("recorded_from", sa.BigInteger, nullable=False, server_default=sa.text("-1")),
    )
    workloads = sa.table("accounting_workloads", sa.column("last_seq"), sa.column("recorded_from"))
    op.execute(workloads.update().values(recorded_from=workloads.c.last_seq))


def downgrade() -> None:
    with op.batch_alter_table("accounting_workloads") as batch:
        batch.drop_column("recorded_from")
    with op.batch_alter_table("accounting_allocations") as batch:
        batch.drop_column("closed_seq")
        batch.drop_column("opened_seq")
    op.drop_index(INDEX, table_name="accounting_processed_events")
    with op.batch_alter_table("accounting_processed_events") as batch:
        for column in ("metered", "at", "state", "seq"):
            batch.drop_column(column)
