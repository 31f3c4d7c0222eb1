"""The scheduler's tables: machines, workloads, desired rows, GPU bookings, intents, outbox."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    utc = sa.DateTime(timezone=True)
    op.create_table(
        "scheduler_machines",
        sa.Column("machine_id", sa.String(64), primary_key=True),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("inventory", sa.Text, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("liveness", sa.String(16), nullable=False),
    )
    op.create_index("ix_scheduler_machines_region", "scheduler_machines", ["region"])
    op.create_table(
        "scheduler_workloads",
        sa.Column("workload_id", sa.String(64), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("class_name", sa.String(64), nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("machine_id", sa.String(64), nullable=True),
        sa.Column("access_token", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("pending_since", utc, nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("created_at", utc, nullable=False),
    )
    op.create_index(
        "ix_scheduler_workloads_region_state", "scheduler_workloads", ["region", "state"]
    )
    op.create_table(
        "scheduler_desired_rows",
        sa.Column(
            "machine_id",
            sa.String(64),
            sa.ForeignKey("scheduler_machines.machine_id"),
            primary_key=True,
        ),
        sa.Column(
            "workload_id",
            sa.String(64),
            sa.ForeignKey("scheduler_workloads.workload_id"),
            primary_key=True,
        ),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("gpus", sa.Text, nullable=False),
        sa.Column("cpus", sa.Float, nullable=False),
        sa.Column("memory_mib", sa.BigInteger, nullable=False),
        sa.Column("since_generation", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "scheduler_gpu_bookings",
        sa.Column("machine_id", sa.String(64), primary_key=True),
        sa.Column("gpu_uuid", sa.String(128), primary_key=True),
        sa.Column("workload_id", sa.String(64), nullable=False),
    )
    op.create_index(
        "ix_scheduler_gpu_bookings_workload_id", "scheduler_gpu_bookings", ["workload_id"]
    )
    op.create_table(
        "scheduler_processed_intents",
        sa.Column("intent_id", sa.String(64), primary_key=True),
        sa.Column("workload_id", sa.String(64), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("processed_at", utc, nullable=False),
    )
    op.create_table(
        "scheduler_outbox",
        sa.Column("event_id", sa.String(160), primary_key=True),
        sa.Column("workload_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
