"""The queue, park, resume and remove, and intents that arrive twice, on a real bus."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import utcnow

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler


async def test_queued_when_full_then_admitted_oldest_first(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    await start_scheduler(store_url)
    t0 = utcnow()
    first = await sim.launch(at=t0)
    await sim.wait_state(first, "scheduled")
    a = await sim.launch(at=t0 + timedelta(seconds=2))
    a_note = await sim.wait_state(a, "queued")
    b = await sim.launch(at=t0 + timedelta(seconds=3))
    b_note = await sim.wait_state(b, "queued")
    # Published last but asked for first (the api's outbox was late): it goes first.
    c = await sim.launch(at=t0 + timedelta(seconds=1))
    c_note = await sim.wait_state(c, "queued")
    assert a_note.reason == (
        "no machine in region local has 1 l40s-48gb free; none ahead; it starts as soon as "
        "capacity frees (a workload parks, is removed or fails, or a machine joins)"
    )
    assert "; 1 workload ahead;" in b_note.reason
    assert "; none ahead;" in c_note.reason

    await sim.intent("remove", first)
    await sim.wait_state(first, "removing")
    await sim.report("m-1", {first: "removed"})
    await sim.wait_state(first, "removed")

    placed = await sim.wait_state(c, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-1"
    assert (sim.state(a), sim.state(b)) == ("queued", "queued")
    await sim.until(lambda: sim.entry("m-1", first) is None, what="first dropped")
    assert sim.entry("m-1", c).resources.gpus == ["GPU-m-1-0"]  # type: ignore[union-attr]


async def test_a_queued_workload_is_admitted_when_a_machine_joins(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await start_scheduler(sqlite_url)
    workload = await sim.launch("l40s-48gb", 2)
    queued = await sim.wait_state(workload, "queued")
    assert queued.reason.startswith("no machine in region local offers l40s-48gb")

    await sim.join("m-new", gpus=2)
    placed = await sim.wait_state(workload, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-new"


async def test_park_releases_devices_and_resume_prefers_the_same_machine(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    await sim.join("m-2", gpus=2)
    await start_scheduler(store_url)
    notebook = await sim.launch()
    await sim.wait_state(notebook, "scheduled")
    [(home, _)] = sim.placed_on(notebook)
    assert home == "m-1"  # best fit
    await sim.report(home, {notebook: "running"})
    await sim.wait_state(notebook, "running")

    await sim.intent("park", notebook)
    parking = await sim.wait_state(notebook, "parking")
    assert parking.reason.startswith("parking on m-1 as asked")
    await sim.until(lambda: sim.entry(home, notebook).target.value == "parked")  # type: ignore[union-attr]
    assert sim.entry(home, notebook).resources.gpus == ["GPU-m-1-0"]  # type: ignore[union-attr]
    await sim.until(lambda: sim.route_gone(notebook), what="route deleted")

    # Devices stay booked until the agent confirms the stop.
    other = await sim.launch()
    await sim.wait_state(other, "scheduled")
    assert sim.placed_on(other)[0][0] == "m-2"

    await sim.report(home, {notebook: "parked"})
    parked = await sim.wait_state(notebook, "parked")
    assert parked.reason.startswith("parked on m-1; its working directory is kept")
    entry = await sim.until(lambda: sim.entry_if(home, notebook, lambda e: not e.resources.gpus))
    assert entry.target.value == "parked"
    assert entry.access_token  # kept, so a resumed notebook keeps its token

    await sim.intent("resume", notebook)
    resumed = await sim.until(
        lambda: [e for e in sim.events[notebook] if e.state.value == "scheduled"][1:] or None,
        what="second placement",
    )
    assert resumed[0].placement is not None
    assert resumed[0].placement.machine == "m-1"
    assert resumed[0].reason == (
        "placed on m-1, which holds its working directory; driver sim: nothing runs (a simulated "
        "machine); given GPU-m-1-0"
    )
    assert sim.entry(home, notebook).resources.gpus == ["GPU-m-1-0"]  # type: ignore[union-attr]


async def test_resume_elsewhere_when_the_home_machine_is_full(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    await start_scheduler(sqlite_url)
    notebook = await sim.launch()
    await sim.wait_state(notebook, "scheduled")
    await sim.intent("park", notebook)
    await sim.wait_state(notebook, "parking")
    await sim.report("m-1", {notebook: "parked"})
    await sim.wait_state(notebook, "parked")
    squatter = await sim.launch()
    await sim.wait_state(squatter, "scheduled")
    await sim.join("m-2", gpus=4)
    await sim.until(lambda: "m-2" in sim.desired, what="m-2 known")

    await sim.intent("resume", notebook)
    await sim.until(
        lambda: len([e for e in sim.events[notebook] if e.state.value == "scheduled"]) == 2
    )
    moved = [e for e in sim.events[notebook] if e.state.value == "scheduled"][1]
    assert moved.placement is not None
    assert moved.placement.machine == "m-2"
    assert moved.reason.startswith(
        "placed on m-2; m-1, which held its working directory, has no room for it now"
    )
    old = await sim.until(lambda: sim.entry("m-1", notebook), what="old entry")
    assert old.target.value == "removed"  # the old directory is cleaned up
    await sim.report("m-1", {squatter: "running"})
    await sim.until(lambda: sim.entry("m-1", notebook) is None, what="old entry dropped")


async def test_remove_stops_and_drops_the_workload(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await start_scheduler(sqlite_url)
    workload = await sim.launch()
    queued_one = await sim.launch("l40s-48gb", 4)
    await sim.wait_state(workload, "scheduled")
    await sim.wait_state(queued_one, "queued")
    await sim.report("m-1", {workload: "running"})
    await sim.wait_state(workload, "running")

    await sim.intent("remove", workload)
    removing = await sim.wait_state(workload, "removing")
    assert removing.reason.startswith("removing from m-1 as asked")
    entry = await sim.until(
        lambda: sim.entry_if("m-1", workload, lambda e: e.target.value == "removed")
    )
    assert entry.resources.gpus == ["GPU-m-1-0"]  # booked until the agent confirms
    await sim.until(lambda: sim.route_gone(workload), what="route deleted")

    await sim.report("m-1", {})  # gone from the agent's report: removed
    removed = await sim.wait_state(workload, "removed")
    assert removed.reason == "removed from m-1; its working directory is deleted"
    await sim.until(lambda: sim.entry("m-1", workload) is None, what="dropped from desired")

    await sim.intent("remove", queued_one)
    gone = await sim.wait_state(queued_one, "removed")
    assert gone.reason == "removed as asked"
    await sim.intent("remove", queued_one)
    await sim.until(lambda: sim.notes(queued_one), what="a note")
    assert sim.notes(queued_one) == [
        "cannot remove a workload that is removed: a removed workload can no longer be changed; "
        "nothing changed"
    ]


async def test_an_intent_seen_twice_changes_nothing(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-1", gpus=4)
    await start_scheduler(store_url)
    intent_id = new_id("intent")
    workload = new_id("workload")
    # Two copies with different message ids, so JetStream does not drop the second.
    await sim.intent("create", workload, intent_id=intent_id, msg_id=f"{intent_id}-a")
    await sim.intent("create", workload, intent_id=intent_id, msg_id=f"{intent_id}-b")
    # And a second create of the same workload under another intent id.
    await sim.intent("create", workload)
    marker = await sim.launch()
    await sim.wait_state(marker, "scheduled")

    await sim.wait_state(workload, "scheduled")
    assert [e.state.value for e in sim.events[workload]] == ["scheduled"]
    assert len(sim.placed_on(workload)) == 1
    [(machine, entry)] = sim.placed_on(workload)
    assert len(entry.resources.gpus) == 1
    gpus = [u for w in sim.desired[machine].workloads for u in w.resources.gpus]  # type: ignore[union-attr]
    assert len(gpus) == len(set(gpus)) == 2


async def test_park_before_placement_and_nonsense_intents_leave_notes(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await start_scheduler(sqlite_url)
    workload = await sim.launch()
    await sim.wait_state(workload, "queued")
    await sim.intent("resume", workload)
    await sim.intent("park", workload)
    parked = await sim.wait_state(workload, "parked")
    assert parked.reason == "parked as asked before it was placed; resume it to queue it again"
    assert sim.notes(workload) == [
        "cannot resume a workload that is queued: a queued workload can only be parked or "
        "removed; nothing changed"
    ]
    await sim.intent("park", workload)
    await sim.until(lambda: len(sim.notes(workload)) == 2)
    assert sim.notes(workload)[1] == (
        "cannot park a workload that is parked: a parked workload can only be resumed or "
        "removed; nothing changed"
    )


async def test_a_bad_intent_is_refused_and_the_rest_go_on(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await start_scheduler(sqlite_url)
    bad = new_id("workload")
    await sim.bus.js.publish(
        names.intent_subject("local", bad), b"{not an intent", headers={"Nats-Msg-Id": bad}
    )
    # A valid intent on another workload's subject is refused too.
    stray = await sim.intent("create", new_id("workload"))
    await sim.bus.js.publish(
        names.intent_subject("local", bad),
        stray.to_bytes(),
        headers={"Nats-Msg-Id": f"{bad}-stray"},
    )
    good = await sim.launch()
    await sim.wait_state(good, "scheduled")
    assert bad not in sim.events

    async def all_acked() -> bool:
        # Acks come last in a cycle, just after the events: wait for them, bounded.
        info = await sim.bus.js.consumer_info(names.INTENTS.name, "scheduler-local")
        return bool(info.num_ack_pending == 0 and info.num_pending == 0)

    await sim.eventually(all_acked, 10, "every intent acked or refused")


async def test_a_removal_the_agent_cannot_finish_fails_and_can_be_retried(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    await start_scheduler(sqlite_url)
    workload = await sim.launch()
    await sim.wait_state(workload, "scheduled")
    await sim.intent("remove", workload)
    await sim.wait_state(workload, "removing")
    # The agent fails a removal only after it has seen it (its report names that generation).
    await sim.until(
        lambda: sim.entry_if("m-1", workload, lambda e: e.target.value == "removed"),
        what="the removal in the desired state",
    )
    await sim.report(
        "m-1", {workload: "failed"}, reasons={workload: "its directory could not be deleted"}
    )
    failed = await sim.wait_state(workload, "failed")
    assert failed.reason == "failed on m-1: its directory could not be deleted"
    # The device is free again: the process is stopped.
    other = await sim.launch()
    await sim.wait_state(other, "scheduled")

    await sim.intent("remove", workload)
    await sim.until(
        lambda: [e.state.value for e in sim.events[workload]].count("removing") == 2,
        what="removing again",
    )
    await sim.report("m-1", {other: "starting"})
    removed = await sim.wait_state(workload, "removed")
    assert removed.reason == "removed from m-1; its working directory is deleted"
