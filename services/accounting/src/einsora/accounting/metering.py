"""Metering: workload events in, allocations opened and closed, in one transaction.

The rule: a transition into a metered state (`running`) that carries what the workload holds
(`metered`) opens an allocation at the event's `at`, unless the workload has one open already;
a transition to any other state closes the workload's open allocation at its `at`. `at` is the
control plane's clock (when the scheduler received the agent's report; a lost machine's last
heartbeat): nothing here reads an agent's clock.

Exactly once, whatever is redelivered, republished or replayed after a restart: an event is
applied only when its `seq` is newer than the last one applied to its workload (an event id is
`<workload>-<seq>`, so one applied before never is), and the new `seq` and the event's id (a
primary key) are recorded in the transaction that applies it; an allocation's opening and
closing events are unique too. Notes change nothing here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.model import METERED_STATES, Allocation, Applied
from einsora.accounting.rollups import ensure_locked, record_closed
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
    last_seq: dict[str, int] = {
        r.workload_id: r.last_seq
        for r in ensure_locked(
            conn,
            t.workloads,
            [
                {"workload_id": w, "tenant_id": first_of[w].tenant_id, "last_seq": -1}
                for w in sorted(first_of)
            ],
            touch="last_seq",
        )
    }
    workload_ids = sorted(first_of)
    open_now = {a.workload_id: a for a in open_allocations(conn, workload_ids)}
    before = dict(last_seq)
    seen: set[str] = set()
    opened: list[Allocation] = []
    closed: list[Allocation] = []
    processed: list[dict[str, Any]] = []
    for e in transitions:
        # An event applied before has a seq no newer than its workload's last (event ids are
        # `<workload>-<seq>`); its id is recorded below all the same, as a unique key.
        if e.event_id in seen or e.seq <= last_seq[e.workload_id]:
            applied.ignored += 1
            continue
        seen.add(e.event_id)
        last_seq[e.workload_id] = e.seq
        processed.append(
            {"event_id": e.event_id, "workload_id": e.workload_id, "processed_at": now}
        )
        applied.events += 1
        current = open_now.get(e.workload_id)
        if e.state in METERED_STATES:
            if current is not None:
                continue  # already metered: its allocation runs on
            allocation = _opened_by(e)
            if allocation is None:
                log.warning(
                    "a workload entered a metered state without what it holds; not metered",
                    extra={"workload_id": e.workload_id, "event_id": e.event_id},
                )
                continue
            open_now[e.workload_id] = allocation
            opened.append(allocation)
            applied.opened += 1
            applied.tenants.add(e.tenant_id)
        elif current is not None:
            # Never before it started, whatever the event says: an interval is never negative.
            current.ended_at = max(e.at, current.started_at)
            current.closed_by_event = e.event_id
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


def _opened_by(event: WorkloadEvent) -> Allocation | None:
    held = event.metered
    if held is None:
        return None
    return Allocation(
        workload_id=event.workload_id,
        tenant_id=event.tenant_id,
        kind=held.kind.value,
        class_name=held.class_name,
        placed_class=held.placed_class,
        region=held.region,
        machine=held.machine,
        gpus=list(held.gpus),
        cpus=float(held.cpus),
        memory_mib=int(held.memory_mib),
        started_at=event.at,
        opened_by_event=event.event_id,
    )


def _store(
    conn: sa.Connection, opened: list[Allocation], closed: list[Allocation], half_life_h: float
) -> None:
    if opened:
        ids = conn.execute(
            t.allocations.insert().returning(t.allocations.c.id, sort_by_parameter_order=True),
            [allocation_values(a) for a in opened],
        ).scalars()
        for a, allocation_id in zip(opened, ids, strict=True):
            a.id = int(allocation_id)
    # Those opened in this batch were inserted with their end already.
    inserted = {id(a) for a in opened}
    earlier = [a for a in closed if id(a) not in inserted]
    if earlier:
        result = conn.execute(
            _CLOSE,
            [
                {"b_id": a.id, "b_ended_at": a.ended_at, "b_closed_by": a.closed_by_event}
                for a in earlier
            ],
        )
        if conn.dialect.supports_sane_multi_rowcount and result.rowcount != len(earlier):
            # The workload rows are locked, so only a bug gets here; the batch is retried.
            raise RuntimeError("an allocation to close was no longer open")
    record_closed(conn, closed, half_life_h, active=_last_opened(opened))


def _last_opened(opened: list[Allocation]) -> dict[str, datetime]:
    latest: dict[str, datetime] = {}
    for a in opened:
        latest[a.tenant_id] = max(latest.get(a.tenant_id, a.started_at), a.started_at)
    return latest


def allocation_values(a: Allocation) -> dict[str, Any]:
    """An allocation as a row of `accounting_allocations` (without its id)."""
    return {
        "workload_id": a.workload_id,
        "tenant_id": a.tenant_id,
        "kind": a.kind,
        "class_name": a.class_name,
        "placed_class": a.placed_class,
        "region": a.region,
        "machine": a.machine,
        "gpu_count": a.gpu_count,
        "gpus": json.dumps(a.gpus),
        "cpus": a.cpus,
        "memory_mib": a.memory_mib,
        "started_at": a.started_at,
        "ended_at": a.ended_at,
        "opened_by_event": a.opened_by_event,
        "closed_by_event": a.closed_by_event,
    }


def allocation_of(r: Any) -> Allocation:
    """An `accounting_allocations` row as an Allocation."""
    return Allocation(
        id=int(r.id),
        workload_id=r.workload_id,
        tenant_id=r.tenant_id,
        kind=r.kind,
        class_name=r.class_name,
        placed_class=r.placed_class,
        region=r.region,
        machine=r.machine,
        gpus=list(json.loads(r.gpus)),
        cpus=float(r.cpus),
        memory_mib=int(r.memory_mib),
        started_at=r.started_at,
        ended_at=r.ended_at,
        opened_by_event=r.opened_by_event,
        closed_by_event=r.closed_by_event,
    )


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


_CLOSE = (
    t.allocations.update()
    .where(t.allocations.c.id == sa.bindparam("b_id"), t.allocations.c.ended_at.is_(None))
    .values(ended_at=sa.bindparam("b_ended_at"), closed_by_event=sa.bindparam("b_closed_by"))
)
_UPDATE_SEQ = (
    t.workloads.update()
    .where(t.workloads.c.workload_id == sa.bindparam("b_workload_id"))
    .values(last_seq=sa.bindparam("b_last_seq"))
)
