"""Events that arrive after later ones of their workload were applied (accounting SIGKILLed
holding them, then redelivered) are metered where they belong in the workload's `seq` order:
a late `running` becomes the stretch it began, a late leaving closes the stretch at its own
time, and nothing is ever counted twice (issue 35; I2 and I5 of DESIGN.md)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa
from nats.aio.msg import Msg

from einsora.accounting import tables as t
from einsora.accounting.decay import decayed_gpu_hours
from einsora.accounting.model import Allocation
from einsora.accounting.service import EVENTS_CONSUMER, AccountingService
from einsora.accounting.store import MIGRATIONS, VERSION_TABLE, AccountingStore
from einsora.accounting.testing import (
    T0,
    SchedulerPlayer,
    ask_report,
    events_done,
    held,
    hours,
)
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import ReportGroup, UsageReportRequest, WorkloadEvent, WorkloadState
from einsora.common.testing import Bus
from einsora.store.migrations import upgrade

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting

S = WorkloadState
NOW = T0 + hours(12)
MIDNIGHT = datetime(T0.year, T0.month, T0.day, tzinfo=UTC) + hours(24)
"""The first midnight after T0 (21:15): stretches of a few hours cross it."""


async def _applied_up_to(store: AccountingStore, workload_id: str, seq: int) -> None:
    """Until accounting has applied the workload's events up to `seq` (its last applied)."""
    stmt = sa.select(t.workloads.c.last_seq).where(t.workloads.c.workload_id == workload_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while (await store.query(lambda conn: conn.execute(stmt).scalar())) != seq:
        assert loop.time() < deadline, f"{workload_id} not applied up to {seq}"
        await asyncio.sleep(0.02)


async def _hold_next(bus: Bus) -> Msg:
    """Take the next message of accounting's durable as a consumer of it that then dies would:
    fetched, neither acknowledged nor refused."""
    sub = await bus.js.pull_subscribe_bind(durable=EVENTS_CONSUMER, stream=names.EVENTS.name)
    [msg] = await sub.fetch(1, timeout=5)
    return msg


async def _check_sums(bus: Bus, accounting: AccountingService, tenant: str) -> list[Allocation]:
    """A tenant's reports (whole days from the day sums, edges from the day pieces) and decayed
    usage equal what its allocations add up to: each counted once, with its final times."""
    allocations = await accounting.store.allocations(tenant_id=tenant)
    want_s = sum(a.gpu_count * a.seconds(NOW) for a in allocations)
    for start, end in ((T0 - hours(48), T0 + hours(48)), (T0 + hours(1), T0 + hours(5))):
        reply = await ask_report(
            bus.nc,
            UsageReportRequest.model_validate(
                {
                    "group_by": ReportGroup.tenant,
                    "tenant_ids": [tenant],
                    "from": start,
                    "to": end,
                    "now": NOW,
                }
            ),
        )
        assert reply.error is None
        within = sum(
            a.gpu_count
            * max(0.0, (min(a.ended_at or NOW, end) - max(a.started_at, start)).total_seconds())
            for a in allocations
        )
        got = sum(item.gpu_hours for item in reply.items) * 3600
        assert abs(got - within) < 1e-3, (start, end, got, within)
    assert within <= want_s
    later = NOW + hours(30)
    [usage] = await accounting.store.tenant_usage([tenant], later, accounting.half_life_h)
    want = sum(
        decayed_gpu_hours(a.gpu_count, a.started_at, a.ended_at or later, later, 24.0)
        for a in allocations
    )
    assert abs(usage.decayed_gpu_hours - want) < 1e-9 * max(1.0, want)
    return allocations


async def test_a_running_held_while_parking_and_parked_were_applied_is_metered_once_back(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    # The probe's sequence: accounting dies holding `running`; `parking` and `parked` come and
    # are applied by the next accounting; `running` is delivered again after them.
    w = new_id("workload")
    what = held(2)
    first = await start_accounting(store_url)
    await scheduler.transition(w, S.scheduled, T0 - hours(1), tenant_id="t-p", metered=what)
    await scheduler.transition(w, S.starting, T0 - hours(0.5), tenant_id="t-p", metered=what)
    await events_done(bus.js)
    await first.stop()

    await scheduler.transition(w, S.running, T0, tenant_id="t-p", metered=what)
    running = await _hold_next(bus)
    assert WorkloadEvent.from_bytes(running.data).state is S.running
    await scheduler.transition(w, S.parking, T0 + hours(2), tenant_id="t-p", metered=what)
    await scheduler.transition(w, S.parked, T0 + hours(3), tenant_id="t-p")
    second = await start_accounting(store_url)
    await _applied_up_to(second.store, w, 5)
    assert await second.store.allocations(workload_id=w) == []
    await running.nak()  # back to the durable, now
    await events_done(bus.js)

    [allocation] = await second.store.allocations(workload_id=w)
    assert (allocation.started_at, allocation.ended_at) == (T0, T0 + hours(2))
    assert (allocation.opened_by_event, allocation.closed_by_event) == (f"{w}-3", f"{w}-4")
    assert allocation.gpus == what.gpus
    assert second.metrics.allocations_open._value.get() == 0
    await _check_sums(bus, second, "t-p")


async def test_a_late_running_that_is_still_the_latest_opens_its_allocation(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url)
    w = new_id("workload")
    running = scheduler.event(w, S.running, T0, metered=held(1))
    # A later transition of the same state (a republish), without what it holds, came first.
    await scheduler.transition(w, S.running, T0 + hours(1))
    await events_done(bus.js)
    await scheduler.send(running)
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert allocation.is_open
    assert (allocation.started_at, allocation.opened_by_event) == (T0, f"{w}-1")
    assert accounting.metrics.allocations_open._value.get() == 1


async def test_a_late_running_before_one_that_opened_starts_that_allocation_at_its_time(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    # In `seq` order, the late one would have opened the allocation and the next run on in it.
    accounting = await start_accounting(store_url)
    w = new_id("workload")
    early = scheduler.event(w, S.running, T0 - hours(1), metered=held(1))
    await scheduler.transition(w, S.running, T0, metered=held(1))
    await scheduler.transition(w, S.failed, T0 + hours(1), metered=held(1))
    await events_done(bus.js)
    await scheduler.send(early)
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert (allocation.started_at, allocation.ended_at) == (T0 - hours(1), T0 + hours(1))
    assert (allocation.opened_by_event, allocation.closed_by_event) == (f"{w}-1", f"{w}-3")
    await _check_sums(bus, accounting, "t-a")


async def test_a_late_parked_inside_an_open_allocation_closes_it_at_its_time(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    accounting = await start_accounting(store_url)
    w = new_id("workload")
    await scheduler.transition(w, S.running, T0, metered=held(2))
    parked = scheduler.event(w, S.parked, T0 + hours(1))
    # Resumed and running again: this `running` finds the first allocation still open.
    await scheduler.transition(w, S.running, T0 + hours(4), metered=held(2, machine="m-2"))
    await events_done(bus.js)
    [still_open] = await accounting.store.allocations(workload_id=w)
    assert still_open.is_open
    await scheduler.send(parked)
    await events_done(bus.js)

    first, second = await accounting.store.allocations(workload_id=w)
    assert (first.started_at, first.ended_at) == (T0, T0 + hours(1))
    assert (first.opened_by_event, first.closed_by_event) == (f"{w}-1", f"{w}-2")
    assert second.is_open
    assert (second.started_at, second.opened_by_event) == (T0 + hours(4), f"{w}-3")
    assert second.machine == "m-2"
    assert accounting.metrics.allocations_open._value.get() == 1
    await _check_sums(bus, accounting, "t-a")


async def test_a_late_parking_moves_a_close_that_came_later_back_to_its_own_time(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    accounting = await start_accounting(store_url)
    w = new_id("workload")
    await scheduler.transition(w, S.running, T0, tenant_id="t-c", metered=held(3))
    parking = scheduler.event(w, S.parking, T0 + hours(1), tenant_id="t-c", metered=held(3))
    # Closed by `parked` after midnight: two days' pieces and sums, then one day's.
    await scheduler.transition(w, S.parked, T0 + hours(4), tenant_id="t-c")
    await events_done(bus.js)
    [closed_late] = await accounting.store.allocations(workload_id=w)
    assert closed_late.ended_at == T0 + hours(4) > MIDNIGHT
    await scheduler.send(parking)
    await events_done(bus.js)

    [allocation] = await _check_sums(bus, accounting, "t-c")
    assert (allocation.started_at, allocation.ended_at) == (T0, T0 + hours(1))
    assert allocation.closed_by_event == f"{w}-2"
    days = await accounting.store.query(
        lambda conn: (
            conn.execute(
                sa.select(t.allocation_days.c.day).where(t.allocation_days.c.workload_id == w)
            )
            .scalars()
            .all()
        )
    )
    assert days == [T0.date()]
    assert accounting.metrics.allocations_open._value.get() == 0


async def test_late_events_of_one_batch_take_their_places_in_seq_order(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    first = await start_accounting(store_url)
    a, b = new_id("workload"), new_id("workload")
    await scheduler.transition(a, S.running, T0, metered=held(1))
    held_a = [
        scheduler.event(a, S.parking, T0 + hours(1), metered=held(1)),
        scheduler.event(a, S.parked, T0 + hours(1.5)),
        scheduler.event(a, S.starting, T0 + hours(3), metered=held(1)),
    ]
    await scheduler.transition(a, S.running, T0 + hours(3.5), metered=held(1))
    held_b = [
        scheduler.event(b, S.running, T0, metered=held(2)),
        scheduler.event(b, S.parking, T0 + hours(2), metered=held(2)),
    ]
    await scheduler.transition(b, S.parked, T0 + hours(4))
    await events_done(bus.js)
    await first.stop()
    # Published while accounting is down: the next one fetches them in one batch.
    for event in (*held_b, *held_a):
        await scheduler.send(event)
    again = await start_accounting(store_url)
    await events_done(bus.js)

    first_a, second_a = await again.store.allocations(workload_id=a)
    assert (first_a.started_at, first_a.ended_at) == (T0, T0 + hours(1))
    assert first_a.closed_by_event == f"{a}-2"
    assert second_a.is_open
    assert (second_a.started_at, second_a.opened_by_event) == (T0 + hours(3.5), f"{a}-5")
    [only_b] = await again.store.allocations(workload_id=b)
    assert (only_b.started_at, only_b.ended_at) == (T0, T0 + hours(2))
    assert (only_b.opened_by_event, only_b.closed_by_event) == (f"{b}-1", f"{b}-2")
    assert again.metrics.allocations_open._value.get() == 1
    await _check_sums(bus, again, "t-a")


async def test_late_events_redelivered_and_replayed_change_nothing(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    accounting = await start_accounting(store_url)
    a, b, c = new_id("workload"), new_id("workload"), new_id("workload")
    late: list[WorkloadEvent] = []
    sent: list[WorkloadEvent] = []

    async def send(event: WorkloadEvent, *, hold: bool = False) -> None:
        (late if hold else sent).append(event)
        if not hold:
            await scheduler.send(event)

    # a: running late after parking and parked; b: parked late inside an open allocation;
    # c: parking late after parked closed it.
    await send(scheduler.event(a, S.running, T0, metered=held(1)), hold=True)
    await send(scheduler.event(a, S.parking, T0 + hours(2), metered=held(1)))
    await send(scheduler.event(a, S.parked, T0 + hours(3)))
    await send(scheduler.event(b, S.running, T0, metered=held(2)))
    await send(scheduler.event(b, S.parked, T0 + hours(1)), hold=True)
    await send(scheduler.event(b, S.running, T0 + hours(2), metered=held(2)))
    await send(scheduler.event(c, S.running, T0, metered=held(4)))
    await send(scheduler.event(c, S.parking, T0 + hours(1), metered=held(4)), hold=True)
    await send(scheduler.event(c, S.parked, T0 + hours(5)))
    await events_done(bus.js)
    for event in late:
        await scheduler.send(event)
    await events_done(bus.js)
    before = await _check_sums(bus, accounting, "t-a")
    assert len(before) == 4
    opened = accounting.metrics.allocations_open._value.get()
    assert opened == 1

    # Each once more under another message id, then the whole stream again from its start
    # (the late ones late again) to a consumer that forgot where it was, after a restart.
    for event in [*late, *sent]:
        await scheduler.send(event, msg_id=new_id("event"))
    await events_done(bus.js)
    assert await accounting.store.allocations(tenant_id="t-a") == before
    assert accounting.metrics.allocations_open._value.get() == opened
    await accounting.stop()
    await bus.js.delete_consumer(names.EVENTS.name, EVENTS_CONSUMER)
    again = await start_accounting(store_url)
    await events_done(bus.js)
    assert await _check_sums(bus, again, "t-a") == before


async def test_a_late_event_older_than_what_was_recorded_before_the_upgrade_changes_nothing(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    # Metered by a version that kept no transitions: what it applied is not known event by
    # event, so a late event from before the upgrade is turned away as it was then.
    store = AccountingStore(store_url)
    w = new_id("workload")
    try:
        await upgrade(store.engine, MIGRATIONS, version_table=VERSION_TABLE, revision="0002")
        async with store.engine.begin() as conn:
            await conn.execute(
                sa.table(
                    "accounting_workloads",
                    *map(sa.column, ("workload_id", "tenant_id", "last_seq")),
                )
                .insert()
                .values(workload_id=w, tenant_id="t-a", last_seq=3)
            )
    finally:
        await store.close()
    accounting = await start_accounting(store_url)
    await scheduler.send(scheduler.event(w, S.running, T0, metered=held(1), seq=2))
    await scheduler.send(scheduler.event(w, S.running, T0 + hours(1), metered=held(1), seq=4))
    await scheduler.send(scheduler.event(w, S.parked, T0 + hours(2), seq=6))
    await scheduler.send(scheduler.event(w, S.running, T0 + hours(1.5), metered=held(1), seq=5))
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert (allocation.started_at, allocation.ended_at) == (T0 + hours(1), T0 + hours(2))
