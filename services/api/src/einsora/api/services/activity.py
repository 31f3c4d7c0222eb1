"""The activity log: the stable name of each action, the log as its readers see it (a page, an
export), and its retention.

What writes the log is `store.py` (in the transaction of each change) and the edge; this module
only names actions and reads and purges rows. A tenant's admins read their tenant's log, the
operator any tenant's; a member is refused (403), and another tenant answers 404. Entries are
newest first, paged on their `seq`, and a username comes from the users table as it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Forbidden, field_error
from einsora.api.pagination import decode_cursor, encode_cursor
from einsora.api.schemas.activity import (
    EXPORT_COLUMNS,
    ActivityFilter,
    ActivityOut,
    ActivityPage,
    ActivityQuery,
    ExportFormat,
)
from einsora.api.services.tenants import visible_tenant
from einsora.api.store import Store
from einsora.common.bus import names
from einsora.common.ids import is_id
from einsora.common.runloop import raise_if_cancelled

log = logging.getLogger("einsora.api.activity")

ACTIONS: dict[str, str] = {
    # route (its endpoint's name) -> the action it records; names are stable, for filters
    "create_workload": "workload.create",
    "park_workload": "workload.park",
    "resume_workload": "workload.resume",
    "remove_workload": "workload.remove",
    "create_access": "access.mint",
    "create_token": "token.create",
    "revoke_token": "token.revoke",
    "create_gateway_key": "gateway_key.create",
    "revoke_gateway_key": "gateway_key.revoke",
    "create_join_token": "join_token.create",
    "revoke_join_token": "join_token.revoke",
    "join": "machine.join",
    "revoke_machine": "machine.revoke",
    "enrol_sim_agent": "machine.enrol_sim",
    "share_machine": "machine.share",
    "reclaim_machine": "machine.reclaim",
    "release_machine": "machine.release",
    "invite_to_machine": "machine_invitation.create",
    "revoke_machine_invitation": "machine_invitation.revoke",
    "accept_machine_invitation": "machine_invitation.accept",
    "create_tenant": "tenant.create",
    "put_tenant_limits": "tenant.limits.set",
    "put_tenant_quota": "tenant.quota.set",
    "invite": "invitation.create",
    "revoke_invitation": "invitation.revoke",
    "accept_invitation": "invitation.accept",
    "redeem_invitation": "invitation.redeem",
    "create_session": "session.begin",
    "create_session_from_link": "session.begin",
    "create_session_from_invitation": "invitation.redeem",
    "end_session": "session.end",
    "create_sign_in_link": "sign_in_link.create",
    "set_password": "password.set",
    "set_member_role": "member.role.set",
    "revoke_member_credentials": "member.credentials.revoke",
    "remove_member": "member.remove",
}

REDEEM_ACTION = "access.redeem"
REDEEM_ROUTE = names.ACCESS_REDEEM_SUBJECT
"""A ticket's redemption is asked over the bus by the proxy: its row names the subject."""

EXPORT_BATCH = 500
PURGE_BATCH = 5000
PURGE_PERIOD_S = 3600.0


def action_name(endpoint: str) -> str:
    """The action a route records; a route missing from `ACTIONS` records its own name (the
    activity test fails until it is named)."""
    return ACTIONS.get(endpoint, endpoint)


_a = m.activity.c
_SELECT = (
    sa.select(
        _a.seq,
        _a.at,
        _a.tenant_id,
        _a.user_id,
        m.users.c.username,
        _a.token_id,
        _a.action,
        _a.route,
        _a.target,
        _a.outcome,
        _a.status,
        _a.request_id,
    )
    .select_from(m.activity)
    .outerjoin(m.users, m.users.c.id == _a.user_id)
)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


async def _filtered(store: Store, principal: Principal, query: ActivityFilter) -> sa.Select[Any]:
    """The rows `principal` may read that `query` asks for (403 for a member, 404 for a tenant
    they may not address)."""
    if not (principal.is_operator or principal.is_admin):
        raise Forbidden("only a tenant's admins (and the operator) read its activity log")
    tenant_id = principal.tenant_id
    if query.tenant is not None:
        async with store.read() as conn:
            tenant_id = (await visible_tenant(conn, principal, query.tenant)).id
    stmt = _SELECT.where(_a.tenant_id == tenant_id)
    if query.start is not None:
        stmt = stmt.where(_a.at >= _utc(query.start))
    if query.end is not None:
        stmt = stmt.where(_a.at < _utc(query.end))
    if query.user is not None:
        if is_id(query.user, "user"):
            stmt = stmt.where(_a.user_id == query.user)
        else:
            named = sa.select(m.users.c.id).where(m.users.c.username == query.user)
            stmt = stmt.where(_a.user_id.in_(named.scalar_subquery()))
    if query.action is not None:
        if query.action.endswith(".*"):
            prefix = query.action[:-1]  # keeps the dot: `workload.*` is not `workloads.*`
            stmt = stmt.where(sa.func.substr(_a.action, 1, len(prefix)) == prefix)
        else:
            stmt = stmt.where(_a.action == query.action)
    return stmt


def _seq_of(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    key = decode_cursor(cursor)
    if not isinstance(key, int) or isinstance(key, bool) or key < 0:
        raise field_error("cursor", "is not a cursor this API returned")
    return key


def _out(row: Any) -> ActivityOut:
    return ActivityOut.model_validate(row, from_attributes=True)


async def _batch(store: Store, stmt: sa.Select[Any], before: int | None, limit: int) -> list[Any]:
    if before is not None:
        stmt = stmt.where(_a.seq < before)
    stmt = stmt.order_by(_a.seq.desc()).limit(limit)
    return list(await store.query(lambda conn: conn.execute(stmt).all()))


async def list_activity(store: Store, principal: Principal, query: ActivityQuery) -> ActivityPage:
    """One page of the log, newest first."""
    before = _seq_of(query.cursor)
    stmt = await _filtered(store, principal, query)
    rows = await _batch(store, stmt, before, query.limit + 1)
    items = [_out(r) for r in rows[: query.limit]]
    more = len(rows) > query.limit
    return ActivityPage(items=items, next_cursor=encode_cursor(items[-1].seq) if more else None)


async def export(
    store: Store, principal: Principal, query: ActivityFilter, fmt: ExportFormat
) -> AsyncIterator[bytes]:
    """The whole of the filtered log, newest first, as JSON lines or CSV (with a header row).

    Authorised before the first byte (the caller gets a 403 or 404, not a broken stream); read
    in batches, each its own query, so no connection is held while the client reads.
    """
    stmt = await _filtered(store, principal, query)

    async def chunks() -> AsyncIterator[bytes]:
        if fmt is ExportFormat.csv:
            yield _csv_lines([list(EXPORT_COLUMNS)])
        before: int | None = None
        while True:
            rows = await _batch(store, stmt, before, EXPORT_BATCH)
            if not rows:
                return
            items = [_out(r).model_dump(mode="json") for r in rows]
            if fmt is ExportFormat.csv:
                yield _csv_lines([[_cell(i[c]) for c in EXPORT_COLUMNS] for i in items])
            else:
                yield b"".join(json.dumps(i, separators=(",", ":")).encode() + b"\n" for i in items)
            before = rows[-1].seq

    return chunks()


def _cell(value: object) -> str:
    if value is None:
        return ""
    text = str(value)
    # A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _csv_lines(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


async def purge(store: Store, before: datetime) -> int:
    """Delete the entries older than `before`, a batch per transaction (so a large purge never
    holds the write lock long); how many were deleted."""
    deleted = 0
    while True:
        doomed = sa.select(_a.seq).where(_a.at < before).limit(PURGE_BATCH).scalar_subquery()
        async with store.write_aside() as conn:
            result = await conn.execute(sa.delete(m.activity).where(_a.seq.in_(doomed)))
        deleted += result.rowcount
        if result.rowcount < PURGE_BATCH:
            return deleted


class ActivityRetention:
    """Purges the entries older than the retention, at start and then every `period_s`."""

    def __init__(
        self,
        store: Store,
        *,
        retention_days: int,
        clock: Callable[[], datetime],
        period_s: float = PURGE_PERIOD_S,
    ) -> None:
        self._store = store
        self._retention = timedelta(days=retention_days)
        self._clock = clock
        self._period_s = period_s
        self._task: asyncio.Task[None] | None = None
        self.purged = 0
        """Entries purged since the start (for tests and the log)."""

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="activity retention")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def purge_once(self) -> int:
        """Purge now; how many entries went."""
        count = await purge(self._store, self._clock() - self._retention)
        self.purged += count
        if count:
            log.info("activity purged", extra={"entries": count})
        return count

    async def _loop(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.purge_once()
            except Exception as exc:
                # The store may be away; the next period tries again.
                log.warning("activity purge failed", extra={"error": repr(exc)})
            await asyncio.sleep(self._period_s)
