"""Limits: rate limits per API token, and the operator's cap on a tenant's workloads.

Rate limits count requests, and launches, per API token in fixed one-minute windows held in
this process's memory (the `limits` library): a refusal is a 429 whose `Retry-After` is the
seconds until the window ends. Several api replicas each count on their own, so a token may make
up to that many times the limit in all. A limit of 0 is off.

The workload cap counts a tenant's workloads that are not removed (parked and failed ones hold
a place until removed). The operator sets it per tenant (`tenant_limits`); a tenant without a
row has the default of the settings. A launch beyond it is a 409, not a 429: waiting does not
help, removing a workload or a higher cap does, and a client that honours 429 would retry for
ever.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import sqlalchemy as sa
from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import FixedWindowRateLimiter
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Conflict, Forbidden, RateLimited
from einsora.api.schemas.limits import TenantLimitsOut, TenantLimitsUpdate
from einsora.api.services.tenants import visible_tenant
from einsora.api.store import Store
from einsora.common.schemas import TERMINAL_STATES, utcnow
from einsora.common.settings import Settings


@dataclass(frozen=True)
class _Limit:
    name: str
    """How the limit is named to the caller (`details[].field`)."""
    item: RateLimitItem
    what: str


class RateLimits:
    """Requests and launches per minute per API token; `check` raises RateLimited past one."""

    def __init__(self, requests_per_minute: int, launches_per_minute: int) -> None:
        self._limiter = FixedWindowRateLimiter(MemoryStorage())
        self._requests = _limit("requests_per_minute", requests_per_minute, "requests")
        self._launches = _limit("launches_per_minute", launches_per_minute, "launches")

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimits:
        return cls(settings.api_requests_per_minute, settings.api_launches_per_minute)

    async def check(self, principal: Principal, *, launch: bool) -> None:
        """Count one request (and one launch) of `principal`'s token, or refuse it with 429."""
        await self._hit(self._requests, principal.token_id)
        if launch:
            await self._hit(self._launches, principal.token_id)

    async def _hit(self, limit: _Limit | None, token_id: str) -> None:
        if limit is None or await self._limiter.hit(limit.item, "token", token_id):
            return
        stats = await self._limiter.get_window_stats(limit.item, "token", token_id)
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        per_minute = limit.item.amount
        raise RateLimited(
            f"this API token is over its limit of {per_minute} {limit.what} per minute; "
            f"retry in {retry_after} s",
            details=[
                {
                    "field": limit.name,
                    "message": f"{per_minute} {limit.what} per minute per API token",
                    "type": "rate_limit",
                }
            ],
            headers={"Retry-After": str(retry_after)},
        )


def _limit(name: str, per_minute: int, what: str) -> _Limit | None:
    return _Limit(name, RateLimitItemPerMinute(per_minute), what) if per_minute else None


def workload_cap(conn: sa.Connection, tenant_id: str, default: int) -> int | None:
    """The cap on `tenant_id`'s workloads (None: no cap): its own, else `default` (0: none)."""
    row = conn.execute(
        sa.select(m.tenant_limits.c.max_workloads).where(m.tenant_limits.c.tenant_id == tenant_id)
    ).first()
    if row is None:
        return default or None
    cap: int | None = row.max_workloads
    return cap


_CAP_SEEN_S = 5.0
"""How long an api trusts what it read of a tenant's own cap: a PUT here forgets it at once,
another replica's PUT is seen within this time."""
_caps_seen: dict[str, tuple[float, bool]] = {}


async def has_own_cap(store: Store, tenant_id: str) -> bool:
    """Whether the operator set a cap of this tenant's own; remembered a few seconds, so a
    launch (the hot path) does not read the store for it every time."""
    now = time.monotonic()
    seen = _caps_seen.get(tenant_id)
    if seen is not None and now - seen[0] < _CAP_SEEN_S:
        return seen[1]
    capped = await store.query(lambda conn: workload_cap(conn, tenant_id, 0) is not None)
    if len(_caps_seen) > 10_000:
        _caps_seen.clear()
    _caps_seen[tenant_id] = (now, capped)
    return capped


def live_workloads(conn: sa.Connection, tenant_id: str) -> int:
    """How many of `tenant_id`'s workloads are not removed (what the cap counts)."""
    count = conn.scalar(
        sa.select(sa.func.count())
        .select_from(m.workloads)
        .where(
            m.workloads.c.tenant_id == tenant_id,
            m.workloads.c.state.not_in([s.value for s in TERMINAL_STATES]),
        )
    )
    return int(count or 0)


def check_workload_cap(conn: sa.Connection, tenant_id: str, default: int, more: int = 1) -> None:
    """Refuse (409) `more` workloads for `tenant_id` when they would pass its cap.

    Run it in the write transaction that inserts the workload: the tenant's row is locked first
    (Postgres; SQLite runs one write at a time), so concurrent launches cannot all pass it.
    """
    conn.execute(sa.select(m.tenants.c.id).where(m.tenants.c.id == tenant_id).with_for_update())
    cap = workload_cap(conn, tenant_id, default)
    if cap is None:
        return
    count = live_workloads(conn, tenant_id)
    if count + more > cap:
        raise Conflict(
            f"this tenant has {count} workloads that are not removed and its cap is {cap}: "
            "remove one, or ask the operator to raise the cap",
            code="workload_cap_reached",
            details=[
                {
                    "field": "max_workloads",
                    "message": f"{count} workloads of a cap of {cap}",
                    "type": "workload_cap",
                }
            ],
        )


async def get(
    store: Store, principal: Principal, tenant_id: str, settings: Settings
) -> TenantLimitsOut:
    """A tenant's limits, for the operator or its own members (any other tenant: 404)."""
    async with store.read() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        return await _limits_of(conn, tenant.id, settings)


async def put(
    store: Store,
    principal: Principal,
    tenant_id: str,
    body: TenantLimitsUpdate,
    settings: Settings,
) -> TenantLimitsOut:
    """Set a tenant's cap (the operator only); members of the tenant get 403, others 404."""
    async with store.write() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        if not principal.is_operator:
            raise Forbidden("only the operator sets a tenant's limits")
        values = {"max_workloads": body.max_workloads, "updated_at": utcnow()}
        dialect = sqlite if conn.dialect.name == "sqlite" else postgresql
        await conn.execute(
            dialect.insert(m.tenant_limits)
            .values(tenant_id=tenant.id, **values)
            .on_conflict_do_update(index_elements=["tenant_id"], set_=values)
        )
        out = await _limits_of(conn, tenant.id, settings)
    _caps_seen.pop(tenant.id, None)  # the next launch reads the new cap
    return out


async def _limits_of(conn: AsyncConnection, tenant_id: str, settings: Settings) -> TenantLimitsOut:
    row = (
        await conn.execute(
            sa.select(m.tenant_limits.c.max_workloads, m.tenant_limits.c.updated_at).where(
                m.tenant_limits.c.tenant_id == tenant_id
            )
        )
    ).first()
    return TenantLimitsOut(
        tenant_id=tenant_id,
        max_workloads=row.max_workloads if row else (settings.tenant_max_workloads or None),
        source="tenant" if row else "default",
        updated_at=row.updated_at if row else None,
        workloads=await conn.run_sync(live_workloads, tenant_id),
        requests_per_minute=settings.api_requests_per_minute or None,
        launches_per_minute=settings.api_launches_per_minute or None,
    )
