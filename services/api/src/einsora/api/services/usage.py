"""Usage reports: what a caller may see of the allocations and token counts accounting holds.

Accounting answers one request per report over `accounting.report`; the api decides whose
usage the caller may see and shapes the answer. A member sees their own share of their
tenant's: the allocations of the workloads they launched and the tokens of their own gateway
keys. A tenant admin sees the whole tenant, the operator every tenant (or the one named).
`group_by=user` is folded here: accounting sums allocations by workload and tokens by key, and
each is credited to the user who launched the workload or owns the key. `group_by=endpoint`
likewise: allocations by workload and tokens by the replica that served them, each credited to
its endpoint (a replica to the endpoint it is a replica of; workloads that are not endpoints
are left out).
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import nats.errors
import sqlalchemy as sa
from nats.aio.client import Client as NATS
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Unavailable, field_error
from einsora.api.schemas.usage import (
    CSV_COLUMNS,
    DEFAULT_WINDOW_DAYS,
    MAX_WINDOW_DAYS,
    UsageGroupBy,
    UsageItemOut,
    UsageQuery,
    UsageReportOut,
)
from einsora.api.services.tenants import visible_tenant
from einsora.api.store import Store
from einsora.common.bus import names
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import (
    ReportGroup,
    UsageItem,
    UsageReportReply,
    UsageReportRequest,
    WorkloadKind,
)

log = logging.getLogger("einsora.api.usage")

REPORT_TIMEOUT_S = 5.0
"""The longest wait for accounting's answer."""

_LOOKUP_CHUNK = 500
"""Ids per `IN (…)` when naming the users of a report's workloads and keys."""

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet reads as the start of a formula in a CSV cell (OWASP's list)."""


class Accounting:
    """Asks accounting for reports over the bus (request/reply, one request per report)."""

    def __init__(self, nc: NATS, timeout_s: float = REPORT_TIMEOUT_S) -> None:
        self._nc = nc
        self._timeout_s = timeout_s

    async def report(self, request: UsageReportRequest) -> UsageReportReply:
        """Accounting's answer; Unavailable when it does not answer in time or cannot report."""
        if not self._nc.is_connected:
            raise Unavailable("usage reports come from accounting, and the bus is not connected")
        try:
            msg = await self._nc.request(
                names.ACCOUNTING_REPORT_SUBJECT, request.to_bytes(), timeout=self._timeout_s
            )
        except nats.errors.NoRespondersError:
            raise Unavailable(
                "usage reports come from accounting, and no accounting service is running; "
                "start it (Solo runs it) and retry"
            ) from None
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(log, "accounting did not answer a report", exc)
            raise Unavailable(
                f"accounting did not answer within {self._timeout_s:g} s; retry shortly"
            ) from None
        try:
            reply = UsageReportReply.from_bytes(msg.data)
        except ValidationError:
            log.warning("accounting's answer to a report is not readable")
            raise Unavailable("accounting's answer could not be read; retry shortly") from None
        if reply.error is not None:
            raise Unavailable(f"accounting could not make the report: {reply.error}")
        return reply


@dataclass(frozen=True)
class Window:
    """[start, end) in UTC."""

    start: datetime
    end: datetime


@dataclass(frozen=True)
class Scope:
    """Whose usage a report sums (see `UsageReportRequest`)."""

    tenant_ids: list[str] | None
    workload_ids: list[str] | None = None
    key_ids: list[str] | None = None

    @property
    def nothing(self) -> bool:
        """A member with no workloads and no keys: nothing of theirs to count."""
        return self.workload_ids == [] and self.key_ids == []


def window_of(query: UsageQuery, now: datetime) -> Window:
    """The report's window, or a 422 naming the field: `to` defaults to now, `from` to
    DEFAULT_WINDOW_DAYS before `to`; `from` before `to`, at most MAX_WINDOW_DAYS apart."""
    end = _utc(query.end, "to") if query.end is not None else now.astimezone(UTC)
    if query.start is not None:
        start = _utc(query.start, "from")
    else:
        try:
            start = end - timedelta(days=DEFAULT_WINDOW_DAYS)
        except OverflowError:
            raise field_error("to", "too early a time to count back from") from None
    if start >= end:
        raise field_error(
            "from", f"must be before `to` ({end.isoformat()}): the window is [from, to)"
        )
    if end - start > timedelta(days=MAX_WINDOW_DAYS):
        raise field_error(
            "from", f"the window is at most {MAX_WINDOW_DAYS} days; ask for several reports"
        )
    return Window(start, end)


def _utc(at: datetime, field: str) -> datetime:
    """`at` in UTC; a time without a zone is UTC already."""
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    try:
        return at.astimezone(UTC)
    except OverflowError:
        raise field_error(field, "out of range once in UTC") from None


async def scope_of(conn: AsyncConnection, principal: Principal, tenant: str | None) -> Scope:
    """Whose usage the caller sees: every tenant or the named one (the operator), the whole
    tenant (its admin), or the member's own workloads and keys. Another tenant: 404."""
    if tenant is not None:
        tenant = (await visible_tenant(conn, principal, tenant)).id
    if principal.is_operator:
        return Scope(None if tenant is None else [tenant])
    tenant_ids = [principal.tenant_id]
    if principal.is_admin:
        return Scope(tenant_ids)
    workloads = m.workloads.c
    keys = m.gateway_keys.c
    workload_ids = await conn.scalars(
        sa.select(workloads.id).where(
            workloads.tenant_id == principal.tenant_id, workloads.created_by == principal.user_id
        )
    )
    # Revoked keys too: their tokens were used while they were live.
    key_ids = await conn.scalars(
        sa.select(keys.id).where(
            keys.tenant_id == principal.tenant_id, keys.user_id == principal.user_id
        )
    )
    return Scope(tenant_ids, sorted(workload_ids), sorted(key_ids))


async def report(
    store: Store, accounting: Accounting, principal: Principal, query: UsageQuery, now: datetime
) -> UsageReportOut:
    """The caller's report for the query (see the module)."""
    window = window_of(query, now)
    async with store.read() as conn:
        scope = await scope_of(conn, principal, query.tenant)
    truncated = False
    if scope.nothing:
        items: list[UsageItem] = []
    elif query.group_by is UsageGroupBy.user:
        by_workload, by_key = await asyncio.gather(
            accounting.report(_request(scope, ReportGroup.workload, window, now)),
            accounting.report(_request(scope, ReportGroup.key, window, now)),
        )
        items = await _fold_users(store, by_workload.items, by_key.items)
        truncated = by_workload.truncated or by_key.truncated
    elif query.group_by is UsageGroupBy.endpoint:
        by_workload, by_replica = await asyncio.gather(
            accounting.report(_request(scope, ReportGroup.workload, window, now)),
            accounting.report(_request(scope, ReportGroup.endpoint, window, now)),
        )
        items = await _fold_endpoints(store, by_workload.items, by_replica.items)
        truncated = by_workload.truncated or by_replica.truncated
    else:
        group = ReportGroup(query.group_by.value)
        answer = await accounting.report(_request(scope, group, window, now))
        items, truncated = list(answer.items), answer.truncated
    single = scope.tenant_ids[0] if scope.tenant_ids and len(scope.tenant_ids) == 1 else None
    if query.group_by is UsageGroupBy.tenant and single is not None and not items:
        items = [UsageItem(group=single)]  # one tenant's report is one row, zeros or not
    return UsageReportOut(
        start=window.start,
        end=window.end,
        group_by=query.group_by,
        items=[_out(i) for i in sorted(items, key=lambda i: i.group)],
        truncated=truncated,
    )


def _request(scope: Scope, group: ReportGroup, window: Window, now: datetime) -> UsageReportRequest:
    return UsageReportRequest(
        tenant_ids=scope.tenant_ids,
        workload_ids=scope.workload_ids,
        key_ids=scope.key_ids,
        group_by=group,
        start=window.start,
        end=window.end,
        now=now,
    )


async def _fold_users(
    store: Store, by_workload: Sequence[UsageItem], by_key: Sequence[UsageItem]
) -> list[UsageItem]:
    """Allocations by workload and tokens by key, summed by the username of each one's user
    (an id the store does not know stays its own group, so nothing is dropped)."""
    async with store.read() as conn:
        launched_by = await _usernames(conn, m.workloads, m.workloads.c.created_by, by_workload)
        owned_by = await _usernames(conn, m.gateway_keys, m.gateway_keys.c.user_id, by_key)
    sums: dict[str, list[float]] = {}
    for item in by_workload:
        row = sums.setdefault(launched_by.get(item.group, item.group), [0.0, 0.0, 0, 0])
        row[0] += item.gpu_hours
        row[1] += item.cpu_core_hours
    for item in by_key:
        row = sums.setdefault(owned_by.get(item.group, item.group), [0.0, 0.0, 0, 0])
        row[2] += item.prompt_tokens
        row[3] += item.completion_tokens
    return [
        UsageItem(
            group=user,
            gpu_hours=gpu,
            cpu_core_hours=cpu,
            prompt_tokens=int(prompt),
            completion_tokens=int(completion),
        )
        for user, (gpu, cpu, prompt, completion) in sums.items()
    ]


async def _fold_endpoints(
    store: Store, by_workload: Sequence[UsageItem], by_replica: Sequence[UsageItem]
) -> list[UsageItem]:
    """Allocations by workload and tokens by serving replica, summed by endpoint: a replica's
    under the endpoint it is a replica of. Workloads that are not endpoints are left out; a
    replica the store does not know stays its own group (tokens are only ever served by
    endpoints, so nothing of theirs is dropped)."""
    async with store.read() as conn:
        endpoint_of = await _endpoints(conn, [*by_workload, *by_replica])
    sums: dict[str, list[float]] = {}
    for item in by_workload:
        if item.group not in endpoint_of:
            continue
        row = sums.setdefault(endpoint_of[item.group], [0.0, 0.0, 0, 0])
        row[0] += item.gpu_hours
        row[1] += item.cpu_core_hours
    for item in by_replica:
        row = sums.setdefault(endpoint_of.get(item.group, item.group), [0.0, 0.0, 0, 0])
        row[2] += item.prompt_tokens
        row[3] += item.completion_tokens
    return [
        UsageItem(
            group=endpoint,
            gpu_hours=gpu,
            cpu_core_hours=cpu,
            prompt_tokens=int(prompt),
            completion_tokens=int(completion),
        )
        for endpoint, (gpu, cpu, prompt, completion) in sums.items()
    ]


async def _endpoints(conn: AsyncConnection, items: Iterable[UsageItem]) -> dict[str, str]:
    """Workload id → the id of the endpoint it is (itself, or what it is a replica of), for the
    endpoints among the workloads `items` name."""
    w = m.workloads.c
    query = sa.select(w.id, sa.func.coalesce(w.replica_of, w.id)).where(
        w.kind == WorkloadKind.endpoint.value
    )
    return await _named(conn, query, w.id, items)


async def _usernames(
    conn: AsyncConnection, table: sa.Table, user_id: sa.Column[str], items: Iterable[UsageItem]
) -> dict[str, str]:
    """Object id → the username of its user, for the objects `items` name."""
    query = sa.select(table.c.id, m.users.c.username).join(m.users, m.users.c.id == user_id)
    return await _named(conn, query, table.c.id, items)


async def _named(
    conn: AsyncConnection,
    query: sa.Select[str, str],
    id_: sa.Column[str],
    items: Iterable[UsageItem],
) -> dict[str, str]:
    """id → name from `query`'s (id, name) rows, for the ids `items` name (a chunk of ids per
    `IN (…)`)."""
    ids = sorted({item.group for item in items})
    found: dict[str, str] = {}
    for i in range(0, len(ids), _LOOKUP_CHUNK):
        rows = await conn.execute(query.where(id_.in_(ids[i : i + _LOOKUP_CHUNK])))
        found.update({row[0]: row[1] for row in rows})
    return found


def _out(item: UsageItem) -> UsageItemOut:
    return UsageItemOut(
        group=item.group,
        gpu_hours=item.gpu_hours,
        cpu_core_hours=item.cpu_core_hours,
        prompt_tokens=item.prompt_tokens,
        completion_tokens=item.completion_tokens,
    )


def as_csv(report: UsageReportOut) -> str:
    """The report's rows as CSV with a header row; a group a spreadsheet would run as a
    formula is prefixed with `'`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for item in report.items:
        group = "'" + item.group if item.group.startswith(_FORMULA_START) else item.group
        writer.writerow(
            (
                group,
                repr(item.gpu_hours),
                repr(item.cpu_core_hours),
                item.prompt_tokens,
                item.completion_tokens,
            )
        )
    return out.getvalue()
