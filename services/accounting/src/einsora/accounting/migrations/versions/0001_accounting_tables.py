"""Accounting's tables: allocations, their day pieces and sums, token usage and its hours,
the events and workload sequences applied, and each tenant's decayed usage."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

AUTO_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    utc = sa.DateTime(timezone=True)
    op.create_table(
        "accounting_allocations",
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
        sa.Column("started_at", utc, nullable=False),
        sa.Column("ended_at", utc, nullable=True),
        sa.Column("opened_by_event", sa.String(160), nullable=False, unique=True),
        sa.Column("closed_by_event", sa.String(160), nullable=True, unique=True),
    )
    op.create_index(
        "ix_accounting_allocations_workload_id", "accounting_allocations", ["workload_id"]
    )
    op.create_index(
        "ix_accounting_allocations_tenant_started",
        "accounting_allocations",
        ["tenant_id", "started_at"],
    )
    op.create_index(
        "ix_accounting_allocations_started_at", "accounting_allocations", ["started_at"]
    )
    op.create_index("ix_accounting_allocations_ended_at", "accounting_allocations", ["ended_at"])
    op.create_index(
        "ux_accounting_allocations_one_open",
        "accounting_allocations",
        ["workload_id"],
        unique=True,
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_table(
        "accounting_allocation_days",
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
    )
    op.create_index(
        "ix_accounting_allocation_days_day_tenant",
        "accounting_allocation_days",
        ["day", "tenant_id", "start_s", "end_s", "gpu_count", "cpus"],
    )
    op.create_table(
        "accounting_usage_days",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("placed_class", sa.String(64), primary_key=True),
        sa.Column("region", sa.String(64), primary_key=True),
        sa.Column("gpu_seconds", sa.Float, nullable=False),
        sa.Column("cpu_core_seconds", sa.Float, nullable=False),
    )
    op.create_table(
        "accounting_workloads",
        sa.Column("workload_id", sa.String(64), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "accounting_processed_events",
        sa.Column("event_id", sa.String(160), primary_key=True),
        sa.Column("workload_id", sa.String(64), nullable=False),
        sa.Column("processed_at", utc, nullable=False),
    )
    op.create_index(
        "ix_accounting_processed_events_processed_at",
        "accounting_processed_events",
        ["processed_at"],
    )
    op.create_table(
        "accounting_tenants",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("decayed_gpu_hours", sa.Float, nullable=False),
        sa.Column("decayed_at", utc, nullable=False),
        sa.Column("half_life_h", sa.Float, nullable=False),
        sa.Column("last_active_at", utc, nullable=False),
    )
    op.create_table(
        "accounting_token_usage",
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("at", utc, nullable=False),
    )
    op.create_index("ix_accounting_token_usage_at", "accounting_token_usage", ["at"])
    op.create_index(
        "ix_accounting_token_usage_tenant_at", "accounting_token_usage", ["tenant_id", "at"]
    )
    op.create_table(
        "accounting_token_hours",
        sa.Column("hour", utc, primary_key=True),
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(256), primary_key=True),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
    )
