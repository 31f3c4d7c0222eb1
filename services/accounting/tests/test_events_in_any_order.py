"""Whatever order a workload's events reach accounting in (some held back and delivered after
later ones, some delivered twice), it ends with the allocations the events make in `seq`
order, and the day sums, day pieces and decayed usage of exactly those: seeded random
histories on the real store (SQLite and Postgres)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.decay import decayed_gpu_hours
from einsora.accounting.model import Allocation
from einsora.accounting.store import AccountingStore
from einsora.accounting.testing import T0, held, hours
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState

S = WorkloadState
HALF_LIFE_H = 24.0
WORKLOADS = 40
LATER = T0 + hours(200)


@dataclass(frozen=True)
class Made:
    """An allocation as the events make it in `seq` order."""

    opened_by: str
    closed_by: str | None
    started_at: datetime
    ended_at: datetime | None
    gpus: int
    machine: str


def history(rng: random.Random, workload: str, tenant: str) -> list[WorkloadEvent]:
    """A workload's transitions: runs, parks, resumes, republished `running`s (some without
    what they hold), and now and then a time earlier than the one before."""
    states = [S.scheduled, S.starting, S.running]
    for _ in range(rng.randint(2, 10)):
        states.append(rng.choice([S.running, S.running, S.parking, S.parked, S.starting, S.failed]))
    events = []
    at = T0
    for seq, state in enumerate(states, start=1):
        at += timedelta(minutes=rng.choice([-20, 10, 30, 90, 240]))
        gpus = rng.choice([1, 2])
        says = state is not S.running or rng.random() < 0.85
        events.append(
            WorkloadEvent(
                event_id=f"{workload}-{seq}",
                workload_id=workload,
                tenant_id=tenant,
                kind=EventKind.transition,
                state=state,
                reason=f"now {state}",
                seq=seq,
                at=at,
                metered=held(gpus, machine=f"m-{seq}") if says else None,
            )
        )
    return events


def in_seq_order(events: list[WorkloadEvent]) -> list[Made]:
    """The rule of metering.py, applied to the events sorted by `seq`."""
    made: list[Made] = []
    current: WorkloadEvent | None = None
    for e in sorted(events, key=lambda e: e.seq):
        if e.state is S.running:
            if current is None and e.metered is not None:
                current = e
        elif current is not None:
            assert current.metered is not None
            made.append(
                Made(
                    current.event_id,
                    e.event_id,
                    current.at,
                    max(e.at, current.at),
                    len(current.metered.gpus),
                    current.metered.machine,
                )
            )
            current = None
    if current is not None:
        assert current.metered is not None
        made.append(
            Made(
                current.event_id,
                None,
                current.at,
                None,
                len(current.metered.gpus),
                current.metered.machine,
            )
        )
    return made


def arrivals(rng: random.Random, events: list[WorkloadEvent]) -> list[list[WorkloadEvent]]:
    """The events in publishing order, a third of them held back to a random later point,
    some delivered again, cut into batches of 1 to 24."""
    order = list(events)
    held_back = [e for e in order if rng.random() < 0.33]
    order = [e for e in order if e not in held_back]
    for e in held_back:
        order.insert(rng.randint(0, len(order)), e)
    order += rng.sample(events, len(events) // 5)
    batches = []
    while order:
        size = rng.randint(1, 24)
        batches.append(order[:size])
        order = order[size:]
    return batches


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_any_arrival_order_meters_what_seq_order_does(store_url: str, seed: int) -> None:
    rng = random.Random(seed)
    tenants = ("t-a", "t-b", "t-c")
    by_workload = {
        f"w-order{seed}x{i:03d}": history(rng, f"w-order{seed}x{i:03d}", tenants[i % 3])
        for i in range(WORKLOADS)
    }
    # Publishing order: the workloads' histories interleaved, each in its own order.
    published: list[WorkloadEvent] = []
    queues = [list(events) for events in by_workload.values()]
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        published.append(queue.pop(0))
    store = AccountingStore(store_url)
    try:
        await store.migrate()
        for batch in arrivals(rng, published):
            await store.apply_events(batch, HALF_LIFE_H)
        stored = await store.allocations()
        await _check(store, stored, by_workload)
        # Everything again, in another order: nothing changes.
        for batch in arrivals(rng, list(reversed(published))):
            await store.apply_events(batch, HALF_LIFE_H)
        assert await store.allocations() == stored
        await _check(store, stored, by_workload)
    finally:
        await store.close()


async def _check(
    store: AccountingStore, stored: list[Allocation], by_workload: dict[str, list[WorkloadEvent]]
) -> None:
    got: dict[str, list[Made]] = defaultdict(list)
    for a in stored:
        got[a.workload_id].append(
            Made(
                a.opened_by_event,
                a.closed_by_event,
                a.started_at,
                a.ended_at,
                a.gpu_count,
                a.machine,
            )
        )
    for workload, events in by_workload.items():
        want = in_seq_order(events)
        assert sorted(got[workload], key=lambda m: m.opened_by) == sorted(
            want, key=lambda m: m.opened_by
        ), workload

    # What each close added: day pieces covering each closed allocation exactly, day sums
    # equal to the pieces, and decayed usage equal to the allocations' integral.
    closed = [a for a in stored if a.ended_at is not None]

    def figures(conn: sa.Connection) -> tuple[dict[int, float], dict[str, float]]:
        pieces: dict[int, float] = defaultdict(float)
        d = t.allocation_days.c
        for piece in conn.execute(sa.select(d.allocation_id, d.start_s, d.end_s)):
            pieces[int(piece.allocation_id)] += piece.end_s - piece.start_s
        sums: dict[str, float] = defaultdict(float)
        u = t.usage_days.c
        for day in conn.execute(sa.select(u.tenant_id, u.gpu_seconds)):
            sums[day.tenant_id] += day.gpu_seconds
        return pieces, sums

    pieces, sums = await store.query(figures)
    # (An allocation closed at its start, by an event timed before it, has no piece.)
    assert set(pieces) == {a.id for a in closed if a.ended_at != a.started_at}
    for a in closed:
        assert a.id is not None
        assert abs(pieces.get(a.id, 0.0) - a.seconds(T0)) < 1e-3
    want_sums: dict[str, float] = defaultdict(float)
    for a in closed:
        want_sums[a.tenant_id] += a.gpu_count * a.seconds(T0)
    for tenant in set(sums) | set(want_sums):
        assert abs(sums[tenant] - want_sums[tenant]) < 1e-3, tenant
    usage = await store.tenant_usage(sorted(want_sums), LATER, HALF_LIFE_H)
    for u in usage:
        decayed = sum(
            decayed_gpu_hours(a.gpu_count, a.started_at, a.ended_at or LATER, LATER, HALF_LIFE_H)
            for a in stored
            if a.tenant_id == u.tenant_id
        )
        assert abs(u.decayed_gpu_hours - decayed) < 1e-9 * max(1.0, decayed), u.tenant_id


async def test_a_close_and_the_next_open_of_one_workload_fit_in_one_batch(store_url: str) -> None:
    # Parked and resumed between two fetches: the store never holds two open at once.
    store = AccountingStore(store_url)
    w = "w-resumed"

    def event(seq: int, state: WorkloadState, at: datetime) -> WorkloadEvent:
        return WorkloadEvent(
            event_id=f"{w}-{seq}",
            workload_id=w,
            tenant_id="t-a",
            kind=EventKind.transition,
            state=state,
            reason=f"now {state}",
            seq=seq,
            at=at,
            metered=held(1),
        )

    try:
        await store.migrate()
        await store.apply_events([event(1, S.running, T0)], HALF_LIFE_H)
        await store.apply_events(
            [event(3, S.running, T0 + hours(2)), event(2, S.parked, T0 + hours(1))], HALF_LIFE_H
        )
        first, second = await store.allocations(workload_id=w)
        assert (first.started_at, first.ended_at) == (T0, T0 + hours(1))
        assert (second.started_at, second.ended_at) == (T0 + hours(2), None)
    finally:
        await store.close()
