"""Accounting's tables: allocations and token usage (the truth), and what makes reports fast.

Every name starts with `accounting_`, because in Solo the services share one database file
(each keeps its own tables and its own Alembic version table, `alembic_version_accounting`).

- `accounting_allocations` is the truth of metered time: one row per stretch a workload spent
  in a metered state, open (`ended_at` NULL) until it leaves it. `opened_by_event` and
  `closed_by_event` are unique, and a partial unique index allows one open allocation per
  workload, so "opened twice" or "closed twice" is a constraint of the database.
- `accounting_processed_events` and `accounting_workloads` (the last `seq` applied) make a
  redelivered event change nothing. A processed event is a workload's applied transition: its
  `seq`, state, `at` and, in a metered state, what it held (`metered`, JSON). With each
  allocation's `opened_seq` and `closed_seq`, they place a late event (seq older than the last
  applied) in the workload's order: the stretch a late `running` began is metered, a late
  leaving closes the stretch at its own time (late.py). A workload's `recorded_from` is the
  `seq` after which every applied transition is kept (its last applied `seq` for one metered
  before they were kept; -1 otherwise).
- `accounting_allocation_days` splits each closed allocation at midnight UTC (epoch seconds,
  so the overlap with a partial day is plain arithmetic on both engines), and
  `accounting_usage_days` sums those pieces per day, tenant, placed class and region: a report
  reads whole days from the sums and only the partial days at its edges from the pieces.
- `accounting_token_usage` holds one row per gateway request; `accounting_token_hours` sums
  them per hour, tenant, key, endpoint (the replica that answered), model and count source,
  for the same reason (hours summed before the source was kept have source `unknown`).
- `accounting_tenants` keeps each tenant's decayed usage of closed allocations at one instant
  (fair share's U), updated with each close.

Everything but the allocations, processed events, workloads and token usage can be rebuilt
from them. The migrations in `migrations/versions` create exactly these.
"""

from __future__ import annotations

import sqlalchemy as sa

from einsora.store import UtcDateTime

UTC_TIME = UtcDateTime(timezone=True)
AUTO_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""An autoincrementing key: SQLite only autoincrements `INTEGER PRIMARY KEY`."""

metadata = sa.MetaData()

allocations = sa.Table(
    "accounting_allocations",
    metadata,
    sa.Column("id", AUTO_ID, primary_key=True, autoincrement=True),
    sa.Column("workload_id", sa.String(64), nullable=False),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("class_name", sa.String(64), nullable=False),
    sa.Column("placed_class", sa.String(64), nullable=False),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("machine", sa.String(64), nullable=False),
    sa.Column("gpu_count", sa.Integer, nullable=False),
    sa.Column("gpus", sa.Text, nullable=False),
    sa.Column("cpus", sa.Float, nullable=False),
    sa.Column("memory_mib", sa.BigInteger, nullable=False),
    sa.Column("started_at", UTC_TIME, nullable=False),
    sa.Column("ended_at", UTC_TIME, nullable=True),
    sa.Column("opened_by_event", sa.String(160), nullable=False, unique=True),
    sa.Column("closed_by_event", sa.String(160), nullable=True, unique=True),
    sa.Column("opened_seq", sa.BigInteger, nullable=True),
    sa.Column("closed_seq", sa.BigInteger, nullable=True),
    sa.Index("ix_accounting_allocations_workload_id", "workload_id"),
    sa.Index("ix_accounting_allocations_tenant_started", "tenant_id", "started_at"),
    sa.Index("ix_accounting_allocations_started_at", "started_at"),
    sa.Index("ix_accounting_allocations_ended_at", "ended_at"),
    sa.Index(
        "ux_accounting_allocations_one_open",
        "workload_id",
        unique=True,
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    ),
)

allocation_days = sa.Table(
    "accounting_allocation_days",
    metadata,
    sa.Column(
        "allocation_id",
        AUTO_ID,
        sa.ForeignKey("accounting_allocations.id"),
        primary_key=True,
    ),
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("workload_id", sa.String(64), nullable=False),
    sa.Column("placed_class", sa.String(64), nullable=False),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("gpu_count", sa.Integer, nullable=False),
    sa.Column("cpus", sa.Float, nullable=False),
    sa.Column("start_s", sa.Float, nullable=False),
    sa.Column("end_s", sa.Float, nullable=False),
    # Covers a report's edge: the day's pieces summed by tenant without reading the table.
    sa.Index(
        "ix_accounting_allocation_days_day_tenant",
        "day",
        "tenant_id",
        "start_s",
        "end_s",
        "gpu_count",
        "cpus",
    ),
)

usage_days = sa.Table(
    "accounting_usage_days",
    metadata,
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("placed_class", sa.String(64), primary_key=True),
    sa.Column("region", sa.String(64), primary_key=True),
    sa.Column("gpu_seconds", sa.Float, nullable=False),
    sa.Column("cpu_core_seconds", sa.Float, nullable=False),
)

workloads = sa.Table(
    "accounting_workloads",
    metadata,
    sa.Column("workload_id", sa.String(64), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("recorded_from", sa.BigInteger, nullable=False, server_default=sa.text("-1")),
)

processed_events = sa.Table(
    "accounting_processed_events",
    metadata,
    sa.Column("event_id", sa.String(160), primary_key=True),
    sa.Column("workload_id", sa.String(64), nullable=False),
    sa.Column("processed_at", UTC_TIME, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("state", sa.String(16), nullable=True),
    sa.Column("at", UTC_TIME, nullable=True),
    sa.Column("metered", sa.Text, nullable=True),
    sa.Index("ix_accounting_processed_events_processed_at", "processed_at"),
    sa.Index("ux_accounting_processed_events_workload_seq", "workload_id", "seq", unique=True),
)

tenants = sa.Table(
    "accounting_tenants",
    metadata,
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("decayed_gpu_hours", sa.Float, nullable=False),
    sa.Column("decayed_at", UTC_TIME, nullable=False),
    sa.Column("half_life_h", sa.Float, nullable=False),
    sa.Column("last_active_at", UTC_TIME, nullable=False),
)

token_usage = sa.Table(
    "accounting_token_usage",
    metadata,
    sa.Column("request_id", sa.String(128), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("at", UTC_TIME, nullable=False),
    sa.Index("ix_accounting_token_usage_at", "at"),
    sa.Index("ix_accounting_token_usage_tenant_at", "tenant_id", "at"),
)

token_hours = sa.Table(
    "accounting_token_hours",
    metadata,
    sa.Column("hour", UTC_TIME, primary_key=True),
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("key_id", sa.String(64), primary_key=True),
    sa.Column("endpoint", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(256), primary_key=True),
    sa.Column("source", sa.String(16), primary_key=True),
    sa.Column("day", sa.Date, nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    sa.Column("requests", sa.BigInteger, nullable=False),
)
