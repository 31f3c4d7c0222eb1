"""Metering: workload events in, allocations opened and closed, in one transaction.

The rule, in each workload's `seq` order: a transition into a metered state (`running`) that
carries what the workload holds (`metered`) opens an allocation at the event's `at`, unless the
workload has one open already; a transition to any other state closes the workload's open
allocation at its `at`. `at` is the control plane's clock (when the scheduler received the
agent's report; a lost machine's last heartbeat): nothing here reads an agent's clock.

Exactly once, whatever is redelivered, republished or replayed after a restart: an event newer
than the last `seq` applied to its workload is applied here, and the new `seq` and the event
(its id a primary key; its `seq`, state, `at` and what it held) are recorded in the transaction
that applies it; an allocation's opening and closing events are unique too. An event no newer
goes to late.py, which recognises one applied before and meters a late one where its `seq`
puts it. Notes change nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.late import apply_late, transition_values
from einsora.accounting.model import METERED_STATES, Allocation, Applied, opened_at
from einsora.accounting.rollups import ensure_locked, record_closed
from einsora.accounting.rows import allocation_of, insert_allocations, store_ends
from einsora.common.schemas import EventKind, WorkloadEvent

log = logging.getLogger("einsora.accounting.metering")


def apply_events(
    conn: sa.Connection, events: Sequence[WorkloadEvent], half_life_h: float, now: datetime
) -> Applied:
    """Apply a batch of workload events (a unit of work: call it inside one transaction)."""
    applied = Applied()
    # Each workload's events in `seq` order, whatever order the batch brought them in.
    transitions = sorted(
        (e for e in events if e.kind is EventKind.transition), key=lambda e: (e.workload_id, e.seq)
    )
    if not transitions:
        return applied
    first_of = {e.workload_id: e for e in reversed(transitions)}
    # Made where missing and locked, in key order: another replica applying the same
    # workloads' events waits here, then sees what this one committed (no event is applied
    # against a stale sequence).
    rows = ensure_locked(
        conn,
        t.workloads,
        [
            {
                "workload_id": w,
                "tenant_id": first_of[w].tenant_id,
                "last_seq": -1,
                "recorded_from": -1,
            }
            for w in sorted(first_of)
        ],
        touch="last_seq",
    )
    last_seq: dict[str, int] = {r.workload_id: r.last_seq for r in rows}
    recorded_from: dict[str, int] = {r.workload_id: r.recorded_from for r in rows}
    newer: list[WorkloadEvent] = []
    late: list[WorkloadEvent] = []
    for e in transitions:
        if e.seq > last_seq[e.workload_id]:
            newer.append(e)
        elif e.seq > recorded_from[e.workload_id]:
            late.append(e)  # applied before, or late: late.py tells which
        else:
            applied.ignored += 1  # from before transitions were kept: turned away as then
    if late:
        apply_late(conn, late, half_life_h, now, applied)
    workload_ids = sorted(first_of)
    open_now = {a.workload_id: a for a in open_allocations(conn, workload_ids)}
    before = dict(last_seq)
    seen: set[str] = set()
    opened: list[Allocation] = []
    closed: list[Allocation] = []
    processed: list[dict[str, Any]] = []
    for e in newer:
        # The same event twice in a batch, or two of one `seq`: the first is applied.
        if e.event_id in seen or e.seq <= last_seq[e.workload_id]:
            applied.ignored += 1
            continue
        seen.add(e.event_id)
        last_seq[e.workload_id] = e.seq
        processed.append(transition_values(e, now))
        applied.events += 1
        current = open_now.get(e.workload_id)
        if e.state in METERED_STATES:
            if current is not None:
                continue  # already metered: its allocation runs on
            if e.metered is None:
                log.warning(
                    "a workload entered a metered state without what it holds; not metered",
                    extra={"workload_id": e.workload_id, "event_id": e.event_id},
                )
                continue
            allocation = opened_at(e.workload_id, e.tenant_id, e.metered, e.at, e.event_id, e.seq)
            open_now[e.workload_id] = allocation
            opened.append(allocation)
            applied.opened += 1
            applied.tenants.add(e.tenant_id)
        elif current is not None:
            # Never before it started, whatever the event says: an interval is never negative.
            current.ended_at = max(e.at, current.started_at)
            current.closed_by_event = e.event_id
            current.closed_seq = e.seq
            del open_now[e.workload_id]
            closed.append(current)
            applied.closed += 1
            applied.tenants.add(current.tenant_id)
            applied.gpu_seconds[(current.tenant_id, current.placed_class)] += (
                current.gpu_count * current.seconds(current.ended_at)
            )
    if processed:
        conn.execute(t.processed_events.insert(), processed)
    moved = [{"b_workload_id": w, "b_last_seq": s} for w, s in last_seq.items() if s != before[w]]
    if moved:
        conn.execute(_UPDATE_SEQ, moved)
    _store(conn, opened, closed, half_life_h)
    return applied


def _store(
    conn: sa.Connection, opened: list[Allocation], closed: list[Allocation], half_life_h: float
) -> None:
    # Closes first: a workload whose allocation closes and whose next opens in one batch has
    # one open at a time in the store too. Those opened in this batch are inserted with their
    # end already.
    inserted = {id(a) for a in opened}
    store_ends(conn, [a for a in closed if id(a) not in inserted], open_only=True)
    insert_allocations(conn, opened)
    record_closed(conn, closed, half_life_h, active=_last_opened(opened))


def _last_opened(opened: list[Allocation]) -> dict[str, datetime]:
    latest: dict[str, datetime] = {}
    for a in opened:
        latest[a.tenant_id] = max(latest.get(a.tenant_id, a.started_at), a.started_at)
    return latest


def open_allocations(conn: sa.Connection, workload_ids: Sequence[str]) -> list[Allocation]:
    """The open allocations of these workloads (at most one each)."""
    rows = conn.execute(
        sa.select(t.allocations).where(
            t.allocations.c.workload_id.in_(list(workload_ids)),
            t.allocations.c.ended_at.is_(None),
        )
    )
    return [allocation_of(r) for r in rows]


def record_imported(
    conn: sa.Connection, allocations: Sequence[Allocation], half_life_h: float
) -> None:
    """Store allocations that closed elsewhere (an import, a benchmark's history) exactly as
    metering would have: rows, day pieces, day sums and decayed usage."""
    closed = [a for a in allocations if a.ended_at is not None]
    if len(closed) != len(allocations):
        raise ValueError("only closed allocations can be imported")
    _store(conn, list(closed), list(closed), half_life_h)


_UPDATE_SEQ = (
    t.workloads.update()
    .where(t.workloads.c.workload_id == sa.bindparam("b_workload_id"))
    .values(last_seq=sa.bindparam("b_last_seq"))
)
