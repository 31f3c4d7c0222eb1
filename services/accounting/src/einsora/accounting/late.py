"""Late events: a transition older than the last one applied to its workload, metered where
it belongs in the workload's `seq` order.

Metering applies a workload's events in `seq` order (metering.py), but one can come after later
ones were applied: accounting is SIGKILLed holding it, the next accounting applies what came
after, then it is delivered again (issue 35). Turned away, it lost a stretch (a late `running`:
the time unmetered) or kept one too long (a late `parking`: the close came with `parked`). So
each applied transition is kept (`accounting_processed_events`: its `seq`, state, `at`, and
what it held in a metered state), and each allocation the `seq` of the events that opened and
closed it. A late event then takes its place, so that the allocations are those the events
would have made in `seq` order, whatever order they came in:

- entering a metered state where no allocation spans its `seq`, it opens one at its `at`,
  closed by the next applied transition that left the metered state (at that one's `at`), or
  open when there is none; when an allocation was opened after it first, that allocation
  starts at the late event instead (its event, time and holdings), keeping its end;
- leaving the metered state inside an allocation's span, it ends that allocation at its own
  `at`, and the rest of the span, from the first metered transition after it that says what
  it holds, becomes an allocation of its own, ending where the old one did;
- anything else is only kept, as a transition.

An end or start recorded before is taken back from the day sums and decayed usage and recorded
again (rollups.py), in the same transaction. So every allocation is still opened by one event
and closed by one, and an event already applied (its id, or its workload's `seq`, kept)
changes nothing. An event at or before the workload's
`recorded_from` is turned away as before: what was applied then is not known event by event.
Late events are rare (a restart's redeliveries are mostly events applied before, recognised by
one query), so this path reads and writes a workload at a time; the in-order path does not
come here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.model import METERED_STATES, Allocation, Applied, opened_at
from einsora.accounting.rollups import record_closed, retract_closed
from einsora.accounting.rows import allocation_of, insert_allocations, rewrite, store_ends
from einsora.common.schemas import Metered, WorkloadEvent, WorkloadState

log = logging.getLogger("einsora.accounting.metering")


@dataclass(frozen=True)
class Step:
    """One applied transition of a workload, as kept."""

    seq: int
    event_id: str
    state: WorkloadState
    at: datetime
    held: Metered | None
    """What it held, in a metered state (None otherwise, or when its event did not say)."""

    @property
    def metered(self) -> bool:
        return self.state in METERED_STATES


def transition_values(e: WorkloadEvent, now: datetime) -> dict[str, Any]:
    """An applied transition as a row of `accounting_processed_events`."""
    held = e.metered if e.state in METERED_STATES else None
    return {
        "event_id": e.event_id,
        "workload_id": e.workload_id,
        "processed_at": now,
        "seq": e.seq,
        "state": e.state.value,
        "at": e.at,
        "metered": None if held is None else held.model_dump_json(),
    }


def apply_late(
    conn: sa.Connection,
    late: Sequence[WorkloadEvent],
    half_life_h: float,
    now: datetime,
    applied: Applied,
) -> None:
    """Meter events older than their workload's last applied `seq` and newer than its
    `recorded_from`, given in `seq` order per workload, with the workload rows locked."""
    fresh = _not_applied(conn, late)
    applied.ignored += len(late) - len(fresh)
    by_workload: dict[str, list[WorkloadEvent]] = defaultdict(list)
    for e in fresh:
        by_workload[e.workload_id].append(e)
    for workload_id, events in by_workload.items():
        workload = _Workload(conn, workload_id, events[0].seq, half_life_h, applied)
        for e in events:
            workload.place(e)
        conn.execute(t.processed_events.insert(), [transition_values(e, now) for e in events])
        applied.events += len(events)


def _not_applied(conn: sa.Connection, late: Sequence[WorkloadEvent]) -> list[WorkloadEvent]:
    """The events neither applied before (by id, or by their workload's `seq`) nor repeated
    in the batch."""
    p = t.processed_events.c
    rows = conn.execute(
        sa.select(p.event_id, p.workload_id, p.seq).where(
            sa.or_(
                p.event_id.in_(sorted({e.event_id for e in late})),
                sa.and_(
                    p.workload_id.in_(sorted({e.workload_id for e in late})),
                    p.seq.in_(sorted({e.seq for e in late})),
                ),
            )
        )
    ).all()
    ids = {r.event_id for r in rows}
    seqs = {(r.workload_id, r.seq) for r in rows}
    fresh = []
    for e in late:
        if e.event_id in ids or (e.workload_id, e.seq) in seqs:
            continue
        ids.add(e.event_id)
        seqs.add((e.workload_id, e.seq))
        fresh.append(e)
    return fresh


class _Workload:
    """A workload's transitions kept from `lo` on, and its allocations around them: enough to
    place an event of `seq` at least `lo`."""

    def __init__(
        self, conn: sa.Connection, workload_id: str, lo: int, half_life_h: float, applied: Applied
    ) -> None:
        self._conn = conn
        self._half_life_h = half_life_h
        self._applied = applied
        p = t.processed_events.c
        self._steps = {
            int(r.seq): Step(
                seq=int(r.seq),
                event_id=r.event_id,
                state=WorkloadState(r.state),
                at=r.at,
                held=None if r.metered is None else Metered.model_validate_json(r.metered),
            )
            for r in conn.execute(
                sa.select(p.seq, p.event_id, p.state, p.at, p.metered).where(
                    p.workload_id == workload_id, p.seq >= lo
                )
            )
        }
        a = t.allocations.c
        self._allocations = [
            allocation_of(r)
            for r in conn.execute(
                sa.select(t.allocations).where(
                    a.workload_id == workload_id,
                    sa.or_(a.ended_at.is_(None), a.closed_seq >= lo, a.opened_seq >= lo),
                )
            )
        ]

    def place(self, e: WorkloadEvent) -> None:
        """Meter one late event where its `seq` puts it, and keep it as a transition."""
        spanning = self._spanning(e.seq)
        if e.state in METERED_STATES:
            if spanning is not None:
                pass  # already metered: the allocation spans it
            elif e.metered is None:
                log.warning(
                    "a workload entered a metered state without what it holds; not metered",
                    extra={"workload_id": e.workload_id, "event_id": e.event_id},
                )
            else:
                allocation = opened_at(
                    e.workload_id, e.tenant_id, e.metered, e.at, e.event_id, e.seq
                )
                edge = self._next_edge(e.seq)
                if isinstance(edge, Allocation):
                    self._start_earlier(edge, allocation)
                else:
                    if edge is not None:
                        _end(allocation, edge.at, edge.event_id, edge.seq)
                    self._add(allocation)
        elif spanning is not None:
            self._cut(spanning, e)
        self._steps[e.seq] = Step(
            seq=e.seq,
            event_id=e.event_id,
            state=e.state,
            at=e.at,
            held=e.metered if e.state in METERED_STATES else None,
        )

    def _spanning(self, seq: int) -> Allocation | None:
        """The allocation open at `seq` in the workload's order, if any."""
        for a in self._allocations:
            opened_before = a.opened_seq is None or a.opened_seq < seq
            closed_after = a.is_open or (a.closed_seq is not None and a.closed_seq > seq)
            if opened_before and closed_after:
                return a
        return None

    def _next_edge(self, seq: int) -> Step | Allocation | None:
        """Where a stretch begun at `seq` ends: the first transition after it that left the
        metered state, or the first allocation opened after it, whichever comes first."""
        left = [s for s in self._steps.values() if s.seq > seq and not s.metered]
        first = min(left, key=lambda s: s.seq, default=None)
        later = [
            (a.opened_seq, a)
            for a in self._allocations
            if a.opened_seq is not None and a.opened_seq > seq
        ]
        if not later:
            return first
        opened_seq, opened = min(later, key=lambda pair: pair[0])
        return opened if first is None or opened_seq < first.seq else first

    def _start_earlier(self, allocation: Allocation, start: Allocation) -> None:
        """`allocation` was opened after `start`'s event, which came late: it starts there
        instead (the late event's time, event and holdings), and keeps its end."""
        was = dataclasses.replace(allocation)
        start.id = allocation.id
        if allocation.closed_by_event is not None:
            _end(start, self._closed_at(was), allocation.closed_by_event, allocation.closed_seq)
        self._allocations[self._allocations.index(allocation)] = start
        if was.is_open:
            rewrite(self._conn, start)
        else:
            retract_closed(self._conn, [was], self._half_life_h)
            rewrite(self._conn, start)
            record_closed(self._conn, [start], self._half_life_h)
            self._applied.gpu_seconds[(was.tenant_id, was.placed_class)] -= _gpu_seconds(was)
            self._applied.gpu_seconds[(start.tenant_id, start.placed_class)] += _gpu_seconds(start)
        self._applied.tenants.add(start.tenant_id)

    def _cut(self, allocation: Allocation, e: WorkloadEvent) -> None:
        """End `allocation` at `e`, which left the metered state inside its span; what remains
        of the span becomes an allocation of its own."""
        was = dataclasses.replace(allocation)
        _end(allocation, e.at, e.event_id, e.seq)
        tenant = allocation.tenant_id
        if was.is_open:
            store_ends(self._conn, [allocation], open_only=True)
            self._applied.closed += 1
        else:
            retract_closed(self._conn, [was], self._half_life_h)
            store_ends(self._conn, [allocation], open_only=False)
            self._applied.gpu_seconds[(tenant, was.placed_class)] -= _gpu_seconds(was)
        record_closed(self._conn, [allocation], self._half_life_h)
        self._applied.gpu_seconds[(tenant, allocation.placed_class)] += _gpu_seconds(allocation)
        self._applied.tenants.add(tenant)
        rest = [
            s
            for s in self._steps.values()
            if s.seq > e.seq
            and (was.closed_seq is None or s.seq < was.closed_seq)
            and s.metered
            and s.held is not None
        ]
        opener = min(rest, key=lambda s: s.seq, default=None)
        if opener is None or opener.held is None:
            return
        after = opened_at(
            allocation.workload_id, tenant, opener.held, opener.at, opener.event_id, opener.seq
        )
        if was.closed_by_event is not None:
            _end(after, self._closed_at(was), was.closed_by_event, was.closed_seq)
        self._add(after)

    def _closed_at(self, allocation: Allocation) -> datetime:
        """The `at` of the event that closed `allocation` (its end was that, or its start when
        that came earlier)."""
        closer = (
            self._steps.get(allocation.closed_seq) if allocation.closed_seq is not None else None
        )
        if closer is not None:
            return closer.at
        assert allocation.ended_at is not None
        return allocation.ended_at

    def _add(self, allocation: Allocation) -> None:
        """Store a new allocation (open, or closed already) and what it adds."""
        insert_allocations(self._conn, [allocation])
        self._allocations.append(allocation)
        active = {allocation.tenant_id: allocation.started_at}
        closed = [] if allocation.is_open else [allocation]
        record_closed(self._conn, closed, self._half_life_h, active=active)
        self._applied.opened += 1
        self._applied.tenants.add(allocation.tenant_id)
        if closed:
            self._applied.closed += 1
            key = (allocation.tenant_id, allocation.placed_class)
            self._applied.gpu_seconds[key] += _gpu_seconds(allocation)


def _end(allocation: Allocation, at: datetime, event_id: str, seq: int | None) -> None:
    # Never before it started, whatever the event says: an interval is never negative.
    allocation.ended_at = max(at, allocation.started_at)
    allocation.closed_by_event = event_id
    allocation.closed_seq = seq


def _gpu_seconds(a: Allocation) -> float:
    assert a.ended_at is not None
    return a.gpu_count * a.seconds(a.ended_at)
