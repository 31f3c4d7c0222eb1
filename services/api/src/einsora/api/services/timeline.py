"""A workload's timeline: reading it, and taking the scheduler's events into it.

An event is stored once (its `event_id` is unique), so a redelivered or republished event adds
nothing. It moves the workload's state and placement only when its `seq` is higher than the
last one applied: an older event that arrives late is kept in the timeline but changes nothing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import NotFound, field_error
from einsora.api.pagination import decode_cursor, encode_cursor
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.workloads import TimelineEntryOut, TimelinePage
from einsora.api.services.workloads import exists
from einsora.api.store import Store, insert_ignore
from einsora.common.ids import is_id
from einsora.common.schemas import EventKind, WorkloadEvent, utcnow

log = logging.getLogger("einsora.api.timeline")

MAX_REASON = 2000


def _after(cursor: str | None) -> tuple[datetime, int] | None:
    if cursor is None:
        return None
    key = decode_cursor(cursor)
    try:
        at, entry_id = key
        when = datetime.fromisoformat(at)
    except (TypeError, ValueError) as exc:
        raise field_error("cursor", "is not a cursor this API returned") from exc
    if when.tzinfo is None or not isinstance(entry_id, int) or not 0 <= entry_id < 2**62:
        raise field_error("cursor", "is not a cursor this API returned")
    return when, entry_id


async def list_entries(
    store: Store, principal: Principal, workload_id: str, query: PageQuery
) -> TimelinePage:
    """A workload's timeline, oldest first."""
    after = _after(query.cursor)
    t = m.timeline.c
    stmt = sa.select(t.id, t.at, t.kind, t.state, t.reason, t.request_id).where(
        t.workload_id == workload_id
    )
    if after is not None:
        stmt = stmt.where(sa.or_(t.at > after[0], sa.and_(t.at == after[0], t.id > after[1])))
    stmt = stmt.order_by(t.at, t.id).limit(query.limit + 1)
    async with store.read() as conn:
        if not await exists(conn, principal, workload_id):
            raise NotFound(f"no workload {workload_id!r}")
        rows = (await conn.execute(stmt)).all()
    page = rows[: query.limit]
    items = [TimelineEntryOut.model_validate(r, from_attributes=True) for r in page]
    cursor = None
    if len(rows) > query.limit:
        cursor = encode_cursor([page[-1].at.isoformat(), page[-1].id])
    return TimelinePage(items=items, next_cursor=cursor)


async def add_note(
    conn: AsyncConnection, workload_id: str, state: str, reason: str, *, at: datetime | None = None
) -> None:
    """A note the api itself writes into a workload's timeline (a repair it made, say), inside
    the caller's transaction; it changes neither the state nor the last event applied."""
    await conn.execute(
        sa.insert(m.timeline).values(
            workload_id=workload_id,
            at=at or utcnow(),
            kind=EventKind.note.value,
            state=state,
            reason=_clean(reason, MAX_REASON),
            request_id=None,
        )
    )


def _clean(text: str, limit: int = 64) -> str:
    """Text from the bus made safe to store (no NUL, which Postgres refuses), bounded."""
    return text.replace("\x00", "")[:limit]


async def apply_event(store: Store, event: WorkloadEvent, request_id: str | None = None) -> bool:
    """Take one workload event into the timeline; False when it changed nothing."""
    return (await apply_events(store, [(event, request_id)]))[0]


async def apply_events(
    store: Store, events: Sequence[tuple[WorkloadEvent, str | None]]
) -> list[bool]:
    """Take workload events (each with the request ID its message carried) into the timeline
    in one transaction; for each, False when it changed nothing."""
    return await store.run(lambda conn: [_apply(conn, e, rid) for e, rid in events])


def _apply(conn: sa.Connection, event: WorkloadEvent, request_id: str | None) -> bool:
    if not is_id(event.workload_id, "workload") or len(event.event_id) > 64:
        log.warning("event with a malformed id ignored", extra={"event_id": event.event_id[:64]})
        return False
    found = conn.execute(_WORKLOAD_OF_EVENT, {"b_id": event.workload_id}).first()
    if found is None or found.tenant_id != event.tenant_id:
        log.warning(
            "event for a workload this api does not have ignored",
            extra={"workload_id": event.workload_id, "event_id": event.event_id},
        )
        return False
    entry: dict[str, Any] = {
        "workload_id": event.workload_id,
        "at": event.at,
        "kind": event.kind.value,
        "state": event.state.value,
        "reason": _clean(event.reason, MAX_REASON),
        "request_id": _clean(event.request_id or request_id or "") or None,
        "event_id": event.event_id,
        "seq": event.seq,
    }
    if event.placement is not None:
        entry["placed_region"] = _clean(event.placement.region)
        entry["placed_machine"] = _clean(event.placement.machine)
        entry["placed_class"] = _clean(event.placement.placed_class)
    if not insert_ignore(conn, m.timeline, entry, keys=["event_id"]):
        return False  # seen before: a redelivery or a republish
    if event.seq > found.last_seq:
        changes: dict[str, Any] = {"last_seq": event.seq, "updated_at": utcnow()}
        if event.kind is EventKind.transition:
            changes["state"] = event.state.value
        if event.placement is not None:
            changes["placed_region"] = _clean(event.placement.region)
            changes["placed_machine"] = _clean(event.placement.machine)
            changes["placed_class"] = _clean(event.placement.placed_class)
        conn.execute(_update_for(tuple(changes)), {"b_id": event.workload_id, **changes})
    return True


# Statements built once, parameters apart, so SQLAlchemy compiles each only once: the timeline
# takes a few events per launch.
_WORKLOAD_OF_EVENT = (
    sa.select(m.workloads.c.tenant_id, m.workloads.c.last_seq)
    .where(m.workloads.c.id == sa.bindparam("b_id"))
    .with_for_update()
)


@functools.cache
def _update_for(columns: tuple[str, ...]) -> sa.Update:
    """The update of these columns of one workload (a handful of combinations in all)."""
    return (
        sa.update(m.workloads)
        .where(m.workloads.c.id == sa.bindparam("b_id"))
        .values({c: sa.bindparam(c) for c in columns})
    )
