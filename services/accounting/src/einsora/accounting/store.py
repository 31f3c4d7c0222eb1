"""Accounting's store: its tables behind an async engine (SQLite or Postgres), its migrations,
and each operation as one unit of work (einsora.store's `run` and `query`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.metering import apply_events, record_imported
from einsora.accounting.model import Allocation, Applied
from einsora.accounting.reports import report
from einsora.accounting.rows import allocation_of
from einsora.accounting.tokens import add_token_usage
from einsora.accounting.usage import rebuild_decay, recent_tenants, tenant_usage
from einsora.common.schemas import (
    TenantUsage,
    TokenUsage,
    UsageReportReply,
    UsageReportRequest,
    WorkloadEvent,
    utcnow,
)
from einsora.store import Database

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_accounting"
EVENT_MEMORY = timedelta(days=31)
"""How long a processed event (its id, and the transition it applied) is kept: longer than
EVENTS keeps a message (30 days), so every transition applied after an event that can still be
delivered late is kept too."""


class AccountingStore(Database):
    """Allocations, token usage and the figures derived from them. In Solo it shares the other
    services' SQLite file (its own tables and version table) and takes turns writing it."""

    async def migrate(self) -> None:  # type: ignore[override]
        await super().migrate(MIGRATIONS, version_table=VERSION_TABLE)

    async def forget_old_events(self, older_than: timedelta = EVENT_MEMORY) -> int:
        """Forget processed events JetStream can no longer redeliver, and the transitions they
        applied (no late event can fall among them any more)."""
        cutoff = utcnow() - older_than

        def forget(conn: sa.Connection) -> int:
            result = conn.execute(
                t.processed_events.delete().where(t.processed_events.c.processed_at < cutoff)
            )
            return int(result.rowcount or 0)

        return await self.run(forget)

    # --- writing ----------------------------------------------------------------------------

    async def apply_events(self, events: Sequence[WorkloadEvent], half_life_h: float) -> Applied:
        """Meter a batch of workload events in one transaction."""
        now = utcnow()
        return await self.run(lambda conn: apply_events(conn, events, half_life_h, now))

    async def add_token_usage(self, usages: Sequence[TokenUsage]) -> list[TokenUsage]:
        """Store a batch of token counts in one transaction; those not stored before."""
        return await self.run(lambda conn: add_token_usage(conn, usages))

    async def import_closed(self, allocations: Sequence[Allocation], half_life_h: float) -> None:
        """Store allocations that closed elsewhere (history, a benchmark) as metering would."""
        await self.run(lambda conn: record_imported(conn, allocations, half_life_h))

    async def rebuild_decay(self, half_life_h: float, now: datetime | None = None) -> int:
        """Recompute decayed usage kept with another half-life; how many tenants."""
        at = now or utcnow()
        return await self.run(lambda conn: rebuild_decay(conn, half_life_h, at))

    # --- reading ----------------------------------------------------------------------------

    async def report(self, request: UsageReportRequest) -> UsageReportReply:
        return await self.query(lambda conn: report(conn, request))

    async def tenant_usage(
        self, tenant_ids: Sequence[str] | None, now: datetime, half_life_h: float
    ) -> list[TenantUsage]:
        """These tenants' usage (None: every tenant with recent use) as of `now`."""

        def read(conn: sa.Connection) -> list[TenantUsage]:
            ids = recent_tenants(conn, now, half_life_h) if tenant_ids is None else tenant_ids
            return tenant_usage(conn, ids, now, half_life_h)

        return await self.query(read)

    async def allocations(
        self, *, workload_id: str | None = None, tenant_id: str | None = None
    ) -> list[Allocation]:
        """Allocations, oldest first (a workload's, a tenant's, or all)."""
        stmt = sa.select(t.allocations).order_by(t.allocations.c.id)
        if workload_id is not None:
            stmt = stmt.where(t.allocations.c.workload_id == workload_id)
        if tenant_id is not None:
            stmt = stmt.where(t.allocations.c.tenant_id == tenant_id)
        return await self.query(lambda conn: [allocation_of(r) for r in conn.execute(stmt)])

    async def count_open(self) -> int:
        stmt = (
            sa.select(sa.func.count())
            .select_from(t.allocations)
            .where(t.allocations.c.ended_at.is_(None))
        )
        return await self.query(lambda conn: int(conn.execute(stmt).scalar_one()))
