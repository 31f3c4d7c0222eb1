"""Limits: rate limits per account and per client address, and the operator's cap on a
tenant's workloads.

Accounts, not tokens, carry limits: requests, and launches, count per user in a tenant, all
their API tokens and dashboard sessions together, since anyone may mint tokens for themself as
fast as they like. The routes that take no API token (sign-in, joins, invitations; not the
probes, `routers/health.py`) count per client address instead: the connection's, or what a
proxy of `trusted_proxies` says it forwarded (a client's own `X-Forwarded-For` is never
believed: `trusted_proxies.py`), an IPv6 one by its /64, which one subscriber usually holds
whole. Each is counted in fixed one-minute windows held in this process's memory (the `limits`
library): a refusal is a 429 whose `Retry-After` is the seconds until the window ends. Several
api replicas each count on their own, so an account may make up to that many times the limit
in all. A limit of 0 is off.

The workload cap counts a tenant's workloads that are not removed (parked and failed ones hold
a place until removed). The operator sets it per tenant (`tenant_limits`); a tenant without a
row has the default of the settings. A launch beyond it is a 409, not a 429: waiting does not
help, removing a workload or a higher cap does, and a client that honours 429 would retry for
ever.
"""

from __future__ import annotations

import ipaddress
import math
import time
from dataclasses import dataclass

import sqlalchemy as sa
from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import FixedWindowRateLimiter
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.types import Scope

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
    per: str
    """Whose limit it is ("per user in a tenant…")."""


_ACCOUNT = "per user in a tenant, all their API tokens and dashboard sessions together"
_YOURS = (
    "you are over your limit of {limit} in this tenant (all your API tokens and dashboard "
    "sessions count together)"
)


class RateLimits:
    """Requests and launches per minute per account (a user in a tenant), and requests per
    minute per client address to the routes that take no token; `check` and `check_address`
    raise RateLimited past one."""

    def __init__(
        self,
        requests_per_minute: int,
        launches_per_minute: int,
        unauthenticated_per_minute: int = 0,
    ) -> None:
        self._limiter = FixedWindowRateLimiter(MemoryStorage())
        self._requests = _limit("requests_per_minute", requests_per_minute, "requests", _ACCOUNT)
        self._launches = _limit("launches_per_minute", launches_per_minute, "launches", _ACCOUNT)
        self._unauthenticated = _limit(
            "unauthenticated_requests_per_minute",
            unauthenticated_per_minute,
            "requests",
            "per client address to the routes that take no API token",
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimits:
        return cls(
            settings.api_requests_per_minute,
            settings.api_launches_per_minute,
            settings.api_unauthenticated_requests_per_minute,
        )

    async def check(self, principal: Principal, *, launch: bool) -> None:
        """Count one request (and one launch) of `principal`'s account, or refuse it (429)."""
        account = ("account", principal.tenant_id, principal.user_id)
        await self._hit(self._requests, account, _YOURS)
        if launch:
            await self._hit(self._launches, account, _YOURS)

    async def check_address(self, scope: Scope) -> None:
        """Count one request to a route that takes no token from the request's client address,
        or refuse it (429)."""
        if self._unauthenticated is None:
            return
        address = client_address(scope)
        over = f"{address} is over its limit of {{limit}} to the routes that take no API token"
        await self._hit(self._unauthenticated, ("address", address), over)

    async def _hit(self, limit: _Limit | None, key: tuple[str, ...], over: str) -> None:
        if limit is None or await self._limiter.hit(limit.item, *key):
            return
        stats = await self._limiter.get_window_stats(limit.item, *key)
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        per_minute = f"{limit.item.amount} {limit.what} per minute"
        raise RateLimited(
            f"{over.replace('{limit}', per_minute)}; retry in {retry_after} s",
            details=[
                {"field": limit.name, "message": f"{per_minute} {limit.per}", "type": "rate_limit"}
            ],
            headers={"Retry-After": str(retry_after)},
        )


def _limit(name: str, per_minute: int, what: str, per: str) -> _Limit | None:
    return _Limit(name, RateLimitItemPerMinute(per_minute), what, per) if per_minute else None


def client_address(scope: Scope) -> str:
    """Whose request this is: the connection's address, or the one a trusted proxy forwarded
    (uvicorn believes only `trusted_proxies`: `service.py`), an IPv6 one as its /64."""
    client = scope.get("client")
    if not client:
        return "unknown"  # a Unix socket: one peer, whoever it is
    host = str(client[0])
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


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
