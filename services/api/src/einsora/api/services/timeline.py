"""A workload's timeline: reading it, and taking the scheduler's events into it.

An event is stored once (its `event_id` is unique), so a redelivered or republished event adds
nothing. A workload's events apply in the order of their `seq`, whatever order they arrive in
(an api SIGKILLed holding unacked events gets them back only after the ack wait, behind the
events that followed them; issue 35, F6):
- the state moves only on an event whose `seq` is higher than the last one applied, so a late
  event never moves it back;
- the placement is the one of the latest event that carried one: a late `scheduled` event still
  places a workload that its later `starting` and `running` events (which carry none) found
  unplaced, but never undoes a placement made after it;
- the timeline lists the scheduler's events in `seq` order, and the api's own entries by time
  among them (`in_sequence`), since events' times need not follow their `seq`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
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
from einsora.api.store import Store, insert_all_ignoring
from einsora.common.ids import is_id
from einsora.common.schemas import EventKind, WorkloadEvent, utcnow
from einsora.store import statements

log = logging.getLogger("einsora.api.consumers.timeline")

MAX_REASON = 2000


def _after(cursor: str | None) -> tuple[datetime, int, int] | None:
    if cursor is None:
        return None
    key = decode_cursor(cursor)
    if not isinstance(key, list):
        raise field_error("cursor", "is not a cursor this API returned")
    try:
        if len(key) == 2:  # a cursor from before entries were ordered by seq (issue 35)
            key = [key[0], -1, key[1]]
        at, seq, entry_id = key
        when = datetime.fromisoformat(at)
    except (TypeError, ValueError) as exc:
        raise field_error("cursor", "is not a cursor this API returned") from exc
    if (
        when.tzinfo is None
        or not isinstance(seq, int)
        or not isinstance(entry_id, int)
        or not -1 <= seq < 2**62
        or not 0 <= entry_id < 2**62
    ):
        raise field_error("cursor", "is not a cursor this API returned")
    return when, seq, entry_id


def in_sequence(workload_id: str) -> sa.Subquery:
    """A workload's timeline with the key that orders it, `(place, rank, id)`.

    The scheduler's events follow their `seq`, though their times need not: one agent's
    report times two transitions alike, a lost machine's are timed at its last heartbeat
    (after the note that it went quiet), a scheduler that took over has its own clock, and a
    late event is inserted last. So an event's `place` is the latest time of the events up to
    its own `seq` (never earlier than one before it), and `rank` is its `seq`. The api's own
    entries (no `seq`) keep their own time, ranked before an event of the same instant."""
    t = m.timeline.c
    place = sa.case(
        (t.seq.is_(None), t.at),
        else_=sa.func.max(t.at).over(
            partition_by=t.seq.is_(None), order_by=(t.seq, t.id), rows=(None, 0)
        ),
    )
    return (
        sa.select(
            t.id,
            t.at,
            t.kind,
            t.state,
            t.reason,
            t.request_id,
            place.label("place"),
            sa.func.coalesce(t.seq, -1).label("rank"),
        )
        .where(t.workload_id == workload_id)
        .subquery("in_sequence")
    )


async def list_entries(
    store: Store, principal: Principal, workload_id: str, query: PageQuery
) -> TimelinePage:
    """A workload's timeline, in order (`in_sequence`)."""
    after = _after(query.cursor)
    t = in_sequence(workload_id).c
    stmt = sa.select(t.id, t.at, t.kind, t.state, t.reason, t.request_id, t.place, t.rank)
    if after is not None:
        place, rank, entry_id = after
        stmt = stmt.where(
            sa.or_(
                t.place > place,
                sa.and_(t.place == place, t.rank > rank),
                sa.and_(t.place == place, t.rank == rank, t.id > entry_id),
            )
        )
    stmt = stmt.order_by(t.place, t.rank, t.id).limit(query.limit + 1)
    async with store.read() as conn:
        if not await exists(conn, principal, workload_id):
            raise NotFound(f"no workload {workload_id!r}")
        rows = (await conn.execute(stmt)).all()
    page = rows[: query.limit]
    items = [TimelineEntryOut.model_validate(r, from_attributes=True) for r in page]
    cursor = None
    if len(rows) > query.limit:
        last = page[-1]
        cursor = encode_cursor([last.place.isoformat(), int(last.rank), last.id])
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
    return await store.run(lambda conn: _apply_all(conn, events))


def _apply_all(
    conn: sa.Connection, events: Sequence[tuple[WorkloadEvent, str | None]]
) -> list[bool]:
    """The events in `seq` order per workload, as if applied one after another, in a handful
    of statements whatever their number: a fetched batch is read at once (its workloads,
    locked, and which of its events are stored), then its new entries inserted and its
    workloads updated at once. A launch brings about three events, so statements per event
    were most of the api's timeline cost."""
    applied = [False] * len(events)
    valid = sorted(
        (
            (i, event, request_id)
            for i, (event, request_id) in enumerate(events)
            if _well_formed(event)
        ),
        key=lambda v: v[1].seq,  # stable: a workload's events in seq order, whatever came first
    )
    workload_ids = sorted({event.workload_id for _, event, _ in valid})
    found = {
        r.id: r
        for chunk in _chunks(workload_ids)
        for r in conn.execute(_WORKLOADS_OF_EVENTS, {"ids": chunk})
    }
    stored = {
        event_id
        for chunk in _chunks(sorted({e.event_id for _, e, _ in valid}))
        for event_id in conn.execute(_STORED_EVENTS, {"ids": chunk}).scalars()
    }
    placed_seq = _placed_seqs(conn, _placed_late(valid, found))
    entries: list[dict[str, Any]] = []
    moved: dict[str, dict[str, Any]] = {}
    for i, event, request_id in valid:
        workload = found.get(event.workload_id)
        if workload is None or workload.tenant_id != event.tenant_id:
            log.warning(
                "event for a workload this api does not have ignored",
                extra={"workload_id": event.workload_id, "event_id": event.event_id},
            )
            continue
        if event.event_id in stored:
            continue  # seen before: a redelivery or a republish
        stored.add(event.event_id)
        applied[i] = True
        placed = event.placement
        entries.append(
            {
                "workload_id": event.workload_id,
                "at": event.at,
                "kind": event.kind.value,
                "state": event.state.value,
                "reason": _clean(event.reason, MAX_REASON),
                "request_id": _clean(event.request_id or request_id or "") or None,
                "event_id": event.event_id,
                "seq": event.seq,
                "placed_region": _clean(placed.region) if placed else None,
                "placed_machine": _clean(placed.machine) if placed else None,
                "placed_class": _clean(placed.placed_class) if placed else None,
            }
        )
        now = moved.get(event.workload_id) or {
            "b_id": workload.id,
            "last_seq": workload.last_seq,
            "state": workload.state,
            "placed_region": workload.placed_region,
            "placed_machine": workload.placed_machine,
            "placed_class": workload.placed_class,
            "current_region": workload.current_region,
        }
        if event.seq > now["last_seq"]:
            now["last_seq"] = event.seq
            if event.kind is EventKind.transition:
                now["state"] = event.state.value
            if event.region is not None:
                # Where its later intents go: a region step's note names the next region
                # (ADR-0022).
                now["current_region"] = _clean(event.region)
        elif placed is None or event.seq <= _placement_seq(now, placed_seq, event.workload_id):
            continue  # an older event arriving late: in the timeline, but it moves nothing
        if placed is not None:
            # The newest event that placed it: its state may have moved on since, but no
            # later event said where it runs (only `scheduled` does).
            placed_seq[event.workload_id] = event.seq
            now["placed_region"] = _clean(placed.region)
            now["placed_machine"] = _clean(placed.machine)
            now["placed_class"] = _clean(placed.placed_class)
        moved[event.workload_id] = now
    if entries:
        insert_all_ignoring(conn, m.timeline, entries, keys=["event_id"])
    if moved:
        at = utcnow()
        statements.execute(
            conn, _MOVE_WORKLOAD, [{**row, "updated_at": at} for row in moved.values()]
        )
    return applied


def _placed_late(
    valid: Sequence[tuple[int, WorkloadEvent, str | None]], found: Mapping[str, Any]
) -> list[str]:
    """The workloads that hold a placement and get a placing event no newer than their last
    one: only for them is the seq of their placement read (a rare path: a redelivery)."""
    late = set()
    for _, event, _ in valid:
        workload = found.get(event.workload_id)
        if (
            event.placement is not None
            and workload is not None
            and workload.placed_machine is not None
            and event.seq <= workload.last_seq
        ):
            late.add(event.workload_id)
    return sorted(late)


def _placed_seqs(conn: sa.Connection, workload_ids: list[str]) -> dict[str, int]:
    """The `seq` of the latest stored event that placed each of these workloads (none: the
    placement came before migration 0014 recorded one in the timeline)."""
    return {
        r.workload_id: r.seq
        for chunk in _chunks(workload_ids)
        for r in conn.execute(_LATEST_PLACEMENTS, {"ids": chunk})
        if r.seq is not None
    }


def _placement_seq(now: Mapping[str, Any], placed_seq: Mapping[str, int], workload_id: str) -> int:
    """The `seq` of the event that set the workload's placement as it stands in `now`: none
    placed yet is -1; one whose event is unknown counts as new as the last event applied, so
    a late event never undoes it."""
    if workload_id in placed_seq:
        return placed_seq[workload_id]
    return -1 if now["placed_machine"] is None else int(now["last_seq"])


def _well_formed(event: WorkloadEvent) -> bool:
    if is_id(event.workload_id, "workload") and len(event.event_id) <= 64:
        return True
    log.warning("event with a malformed id ignored", extra={"event_id": event.event_id[:64]})
    return False


def _chunks(values: list[str], size: int = 500) -> Iterator[list[str]]:
    """At most `size` values per IN list (SQLite bounds a statement's parameters)."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


# Statements built once, parameters apart, so SQLAlchemy compiles each only once. The lock on
# the workloads (Postgres; SQLite has one writer) orders two api replicas that were handed the
# same event, so the read of stored events after it is exact.
_W = m.workloads.c
_WORKLOADS_OF_EVENTS = (
    sa.select(
        _W.id,
        _W.tenant_id,
        _W.last_seq,
        _W.state,
        _W.placed_region,
        _W.placed_machine,
        _W.placed_class,
        _W.current_region,
    )
    .where(_W.id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(_W.id)
    .with_for_update()
)
_STORED_EVENTS = sa.select(m.timeline.c.event_id).where(
    m.timeline.c.event_id.in_(sa.bindparam("ids", expanding=True))
)
_LATEST_PLACEMENTS = (
    sa.select(m.timeline.c.workload_id, sa.func.max(m.timeline.c.seq).label("seq"))
    .where(
        m.timeline.c.workload_id.in_(sa.bindparam("ids", expanding=True)),
        m.timeline.c.placed_machine.is_not(None),
    )
    .group_by(m.timeline.c.workload_id)
)
_MOVE_WORKLOAD = (
    sa.update(m.workloads)
    .where(_W.id == sa.bindparam("b_id"))
    .values(
        {
            c: sa.bindparam(c)
            for c in (
                "last_seq",
                "state",
                "placed_region",
                "placed_machine",
                "placed_class",
                "current_region",
                "updated_at",
            )
        }
    )
)
