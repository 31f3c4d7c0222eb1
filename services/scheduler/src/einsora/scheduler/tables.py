"""The scheduler's tables: the truth that the `machines` bucket and the events project.

Every name starts with `scheduler_`, because in Solo the services share one database file
(each keeps its own tables and its own Alembic version table, `alembic_version_scheduler`).
`scheduler_gpu_bookings` makes "no device booked twice" a constraint of the database, not only
of the code. The migrations in `migrations/versions` create exactly these.
"""

from __future__ import annotations

import sqlalchemy as sa

from einsora.store import UtcDateTime

# The scheduler's columns carry a time zone (`timestamptz` on Postgres), as its first
# migration made them; the values are aware UTC either way.
UTC_TIME = UtcDateTime(timezone=True)


metadata = sa.MetaData()

machines = sa.Table(
    "scheduler_machines",
    metadata,
    sa.Column("machine_id", sa.String(64), primary_key=True),
    sa.Column("region", sa.String(64), nullable=False, index=True),
    sa.Column("inventory", sa.Text, nullable=False),
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("liveness", sa.String(16), nullable=False),
)

workloads = sa.Table(
    "scheduler_workloads",
    metadata,
    sa.Column("workload_id", sa.String(64), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("user_id", sa.String(64), nullable=True),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("name", sa.String(128), nullable=False, server_default=""),
    sa.Column("class_name", sa.String(64), nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("machine_id", sa.String(64), nullable=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("pending_since", UTC_TIME, nullable=True),
    sa.Column("request_id", sa.String(128), nullable=True),
    sa.Column("created_at", UTC_TIME, nullable=False),
    sa.Column("placed_class", sa.String(64), nullable=True),
    sa.Column("fallback", sa.Text, nullable=True),
    sa.Index("ix_scheduler_workloads_region_state", "region", "state"),
)

desired_rows = sa.Table(
    "scheduler_desired_rows",
    metadata,
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
    sa.Column("driver", sa.String(32), nullable=True),
)

gpu_bookings = sa.Table(
    "scheduler_gpu_bookings",
    metadata,
    sa.Column("machine_id", sa.String(64), primary_key=True),
    sa.Column("gpu_uuid", sa.String(128), primary_key=True),
    sa.Column("workload_id", sa.String(64), nullable=False, index=True),
)

processed_intents = sa.Table(
    "scheduler_processed_intents",
    metadata,
    sa.Column("intent_id", sa.String(64), primary_key=True),
    sa.Column("workload_id", sa.String(64), nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("processed_at", UTC_TIME, nullable=False),
)

outbox = sa.Table(
    "scheduler_outbox",
    metadata,
    sa.Column("event_id", sa.String(160), primary_key=True),
    sa.Column("workload_id", sa.String(64), nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
)

handoffs = sa.Table(
    "scheduler_handoffs",
    metadata,
    sa.Column("intent_id", sa.String(64), primary_key=True),
    sa.Column("workload_id", sa.String(64), nullable=False),
    sa.Column("subject", sa.String(256), nullable=False),
    sa.Column("request_id", sa.String(128), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
)
"""Intents for other regions' schedulers (a region step's hand-over, an intent passed on),
stored with the decision and deleted once published (ADR-0022)."""

leases = sa.Table(
    "scheduler_leases",
    metadata,
    sa.Column("region", sa.String(64), primary_key=True),
    sa.Column("term", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.String(128), nullable=False),
)
