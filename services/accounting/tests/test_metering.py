"""Metering from workload events: an allocation opens at `running` and closes when the workload
leaves it, at the events' own times, exactly once whatever is redelivered or restarted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.accounting.service import EVENTS_CONSUMER
from einsora.accounting.testing import T0, SchedulerPlayer, events_done, held, hours
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import EventKind, WorkloadKind, WorkloadState
from einsora.common.testing import Bus

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting

S = WorkloadState


async def test_running_opens_an_allocation_and_leaving_it_closes_it_at_the_events_times(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    accounting = await start_accounting(store_url)
    w = new_id("workload")
    what = held(
        2, machine="m-7", placed_class="a100-80gb", region="east", cpus=12.5, memory_mib=98304
    )
    for state, at in ((S.scheduled, T0 - hours(1)), (S.starting, T0 - hours(0.5))):
        await scheduler.transition(w, state, at, tenant_id="t-x", metered=what)
    await scheduler.transition(w, S.running, T0, tenant_id="t-x", metered=what)
    await scheduler.transition(w, S.running, T0, tenant_id="t-x", kind=EventKind.note)
    await events_done(bus.js)

    [opened] = await accounting.store.allocations(workload_id=w)
    assert opened.is_open
    assert opened.started_at == T0
    assert opened.tenant_id == "t-x"
    assert (opened.kind, opened.class_name, opened.placed_class) == (
        WorkloadKind.notebook.value,
        "a100-80gb",
        "a100-80gb",
    )
    assert (opened.region, opened.machine) == ("east", "m-7")
    assert opened.gpus == ["GPU-m-7-0", "GPU-m-7-1"]
    assert opened.gpu_count == 2
    assert (opened.cpus, opened.memory_mib) == (12.5, 98304)
    assert opened.opened_by_event == f"{w}-3"
    assert accounting.metrics.allocations_open._value.get() == 1

    await scheduler.transition(w, S.parking, T0 + hours(3), tenant_id="t-x", metered=what)
    await scheduler.transition(w, S.parked, T0 + hours(4), tenant_id="t-x")
    await events_done(bus.js)
    [closed] = await accounting.store.allocations(workload_id=w)
    assert closed.ended_at == T0 + hours(3)
    assert closed.closed_by_event == f"{w}-5"
    assert closed.seconds(T0) == 3 * 3600
    assert accounting.metrics.allocations_open._value.get() == 0

    # Resumed: a second allocation, open again, the first untouched.
    await scheduler.transition(w, S.running, T0 + hours(5), tenant_id="t-x", metered=what)
    await events_done(bus.js)
    first, second = await accounting.store.allocations(workload_id=w)
    assert first == closed
    assert second.is_open
    assert second.started_at == T0 + hours(5)


async def test_an_open_allocation_is_not_opened_again(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url)
    w = new_id("workload")
    await scheduler.transition(w, S.running, T0, metered=held(1))
    # A later event of the same state (a republish with a new seq) meters nothing new.
    await scheduler.transition(w, S.running, T0 + hours(1), metered=held(1))
    await scheduler.transition(w, S.failed, T0 + hours(2), metered=held(1))
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert (allocation.started_at, allocation.ended_at) == (T0, T0 + hours(2))


async def test_redelivered_and_replayed_events_change_nothing(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    accounting = await start_accounting(store_url)
    w = new_id("workload")
    running = scheduler.event(w, S.running, T0, metered=held(4))
    parking = scheduler.event(w, S.parking, T0 + hours(2), metered=held(4))
    for event in (running, parking):
        await scheduler.send(event)
        # The same event under another message id: JetStream keeps both.
        await scheduler.send(event, msg_id=new_id("event"))
    await events_done(bus.js)
    before = await accounting.store.allocations()
    assert len(before) == 1
    assert (before[0].started_at, before[0].ended_at) == (T0, T0 + hours(2))

    # After a restart on the same store, the same events once more, and the whole stream
    # replayed from its start by a consumer that forgot where it was.
    await accounting.stop()
    for event in (running, parking):
        await scheduler.send(event, msg_id=new_id("event"))
    await bus.js.delete_consumer(names.EVENTS.name, EVENTS_CONSUMER)
    again = await start_accounting(store_url)
    await events_done(bus.js)
    assert await again.store.allocations() == before
    usage = await again.store.tenant_usage(["t-a"], T0 + hours(2), again.half_life_h)
    # Two hours of 4 GPUs, counted once, decayed by nothing yet at the moment it ended.
    expected = 4 * 24 / 0.6931471805599453 * (1 - 2 ** (-2 / 24))
    assert abs(usage[0].decayed_gpu_hours - expected) < 1e-9


async def test_an_event_of_a_seq_already_applied_changes_nothing(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    # (An older `seq` not applied yet is a late event, metered in its place: test_late_events.)
    accounting = await start_accounting(store_url)
    w = new_id("workload")
    await scheduler.transition(w, S.running, T0, metered=held(1), seq=3)
    await scheduler.transition(w, S.failed, T0 + hours(1), metered=held(1), seq=4)
    # Applied first: events of one batch are applied in seq order, whatever order they came in,
    # so the stale ones must come after these were applied to be "older than the last applied".
    await events_done(bus.js)
    # Stale events, with new ids but the seqs applied, arrive late.
    for state, at, seq in ((S.running, T0 - hours(1), 3), (S.parked, T0 + hours(0.5), 4)):
        stale = scheduler.event(w, state, at, metered=held(1), seq=seq)
        await scheduler.send(stale.model_copy(update={"event_id": f"{w}-stale-{seq}"}))
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert (allocation.started_at, allocation.ended_at) == (T0, T0 + hours(1))


async def test_events_out_of_order_in_one_batch_are_applied_in_seq_order(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    w = new_id("workload")
    running = scheduler.event(w, S.running, T0, metered=held(1))
    failed = scheduler.event(w, S.failed, T0 + hours(1), metered=held(1))
    # Published before accounting starts, so it fetches both in one batch, newest first.
    await scheduler.send(failed)
    await scheduler.send(running)
    accounting = await start_accounting(sqlite_url)
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert (allocation.started_at, allocation.ended_at) == (T0, T0 + hours(1))


async def test_a_close_before_the_start_never_makes_a_negative_interval(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url)
    w = new_id("workload")
    await scheduler.transition(w, S.running, T0, metered=held(1))
    await scheduler.transition(w, S.failed, T0 - hours(1), metered=held(1))
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert allocation.ended_at == allocation.started_at == T0


async def test_a_stop_mid_stream_then_a_fresh_service_loses_and_repeats_nothing(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    first = await start_accounting(store_url, batch=8)
    workloads = [new_id("workload") for _ in range(40)]
    for i, w in enumerate(workloads[:20]):
        await scheduler.run_for(w, T0 + hours(i), T0 + hours(i + 1.5), metered=held(1))
    for w in workloads[20:]:
        await scheduler.transition(w, S.running, T0, metered=held(2))
    await events_done(bus.js)
    await first.stop()

    # While it is down, the open ones close and more events come.
    for i, w in enumerate(workloads[20:]):
        await scheduler.transition(w, S.removing, T0 + hours(i + 1), metered=held(2))
    second = await start_accounting(store_url, batch=8)
    await events_done(bus.js)
    allocations = await second.store.allocations()
    assert len(allocations) == 40
    assert {a.workload_id for a in allocations} == set(workloads)
    by_workload = {a.workload_id: a for a in allocations}
    for w in workloads[:20]:
        assert by_workload[w].seconds(T0) == 1.5 * 3600
    for i, w in enumerate(workloads[20:]):
        assert by_workload[w].ended_at == T0 + hours(i + 1)
    assert second.metrics.allocations_open._value.get() == 0


async def test_notes_only_batches_write_nothing(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url)
    w = new_id("workload")
    for _ in range(3):
        await scheduler.transition(w, S.queued, T0, kind=EventKind.note)
    await events_done(bus.js)
    assert await accounting.store.allocations() == []
    commits = accounting.store.commits
    await scheduler.transition(w, S.queued, T0, kind=EventKind.note)
    await events_done(bus.js)
    assert accounting.store.commits == commits


async def test_an_unreadable_event_is_terminated_and_the_rest_go_on(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url)
    w = new_id("workload")
    await bus.js.publish(names.event_subject(w), b"{not json")
    other = new_id("workload")
    # An event whose subject names another workload is refused too.
    stray = scheduler.event(other, S.running, T0, metered=held(1))
    await bus.js.publish(names.event_subject(w), stray.to_bytes())
    await scheduler.transition(w, S.running, T0, metered=held(1))
    await events_done(bus.js)
    assert [a.workload_id for a in await accounting.store.allocations()] == [w]
    consumer = accounting._consumers[0]
    assert sum(consumer.terminated.values()) == 2
