"""What a machine's owner lends (issue 15, ADR-0017), decided by a real scheduler on a real bus.

Placement gives only the lent GPUs and at most the lent cores and memory; a narrowing preempts
the guests that no longer fit after the grace and their minimum runtime, never the owner's own;
lending again before then cancels it. The scheduler's wall clock is the test's own (`ManualClock`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from einsora.common.schemas import (
    Enrolment,
    SharingLevel,
    Target,
)
from einsora.common.testing import ManualClock, enrol

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

OWNER = "t-alice"
GUEST = "t-test"  # the tenant Sim launches as


async def _enrol(sim: Sim, machine_id: str, **fields: Any) -> Enrolment:
    """The machine's enrolment as the api puts it: Alice's, shared with the guest by default."""
    values: dict[str, Any] = {
        "owner_tenant_id": OWNER,
        "sharing": SharingLevel.invite_only,
        "guests": (GUEST,),
    }
    return await enrol(sim.bus.js, machine_id, **(values | fields))


async def _run(sim: Sim, machine_id: str, *workload_ids: str) -> None:
    """The agent reports them running (with what else it runs)."""
    desired = sim.desired.get(machine_id)
    running = {
        w.workload_id: "running"
        for w in (desired.workloads if desired else [])
        if w.target is Target.running
    }
    await sim.report(machine_id, running)
    for workload_id in workload_ids:
        await sim.wait_state(workload_id, "running")


def _noted(sim: Sim, workload_id: str, words: str) -> bool:
    return any(words in note for note in sim.notes(workload_id))


def _gpus(sim: Sim, machine_id: str, workload_id: str) -> list[str]:
    entry = sim.entry(machine_id, workload_id)
    return [] if entry is None else list(entry.resources.gpus)


async def test_only_lent_gpus_are_given_and_the_note_names_the_lend(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    lent = ["GPU-m-1-1", "GPU-m-1-3"]
    await _enrol(sim, "m-1", owner_tenant_id=GUEST, lend={"gpus": lent})
    await sim.join("m-1", enrolled=None, gpus=4)
    await start_scheduler(sqlite_url)

    # Three devices: the machine has four, but its owner lends two.
    big = await sim.launch(count=3)
    queued = await sim.wait_state(big, "queued")
    assert "m-1: its owner lends 2 of 4 l40s-48gb" in queued.reason
    assert "until an owner lends more" in queued.reason
    await sim.intent("remove", big, count=3)
    await sim.wait_state(big, "removed")

    first, second, third = [await sim.launch() for _ in range(3)]
    for workload_id in (first, second):
        await sim.wait_state(workload_id, "scheduled")
    await sim.wait_state(third, "queued")
    given = sorted(_gpus(sim, "m-1", first) + _gpus(sim, "m-1", second))
    assert given == lent  # never an unlent device, even to the owner's own workloads

    # Lent whole again: the queued ones are placed on what is now lent.
    await _enrol(sim, "m-1", owner_tenant_id=GUEST, lend=None)
    await sim.wait_state(third, "scheduled")
    assert _gpus(sim, "m-1", third)[0] not in lent


async def test_cores_and_memory_are_given_within_the_lend(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await _enrol(sim, "m-1", owner_tenant_id=GUEST, lend={"cpus": 4, "memory_mib": 16384})
    await sim.join("m-1", enrolled=None, gpus=0, cpus=8, memory_gib=64)
    await start_scheduler(sqlite_url)

    large = await sim.launch("cpu-8c-32g")
    queued = await sim.wait_state(large, "queued")
    assert "m-1: its owner lends 4 of 8 cores and 16 of 64 GiB of memory" in queued.reason

    fits = await sim.launch("cpu-4c-16g")
    await sim.wait_state(fits, "scheduled")
    entry = sim.entry("m-1", fits)
    assert entry is not None
    assert (entry.resources.cpus, entry.resources.memory_mib) == (4, 16384)
    # The lend is used up (the machine has 4 cores and 48 GiB more, not lent).
    small = await sim.launch("cpu-1c-2g")
    waiting = await sim.wait_state(small, "queued")
    assert "has 1 cores and 2 GiB (1 cpu-1c-2g) free" in waiting.reason

    # Lent more: the small one is placed; the large one still waits for more.
    await _enrol(sim, "m-1", owner_tenant_id=GUEST, lend={"cpus": 6, "memory_mib": 20480})
    await sim.wait_state(small, "scheduled")
    assert sim.state(large) == "queued"


async def test_a_narrowing_preempts_the_newest_guests_until_the_rest_fit(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    clock = ManualClock()
    await _enrol(sim, "m-1", reclaim_grace_s=120, guest_min_runtime_s=600)
    await sim.join("m-1", enrolled=None, gpus=0, cpus=16, memory_gib=64)
    await start_scheduler(sqlite_url, clock=clock)

    old = await sim.launch("cpu-4c-16g")
    await sim.wait_state(old, "scheduled")
    await _run(sim, "m-1", old)
    clock.advance(1000)  # it has run long past its minimum runtime
    new = await sim.launch("cpu-4c-16g")
    own = await sim.launch("cpu-4c-16g", tenant_id=OWNER)
    await sim.wait_state(new, "scheduled")
    await sim.wait_state(own, "scheduled")
    await _run(sim, "m-1", new, own)
    started = clock.now

    # 12 cores are held, 8 lent: the newest guest goes; then the rest fit.
    await _enrol(sim, "m-1", reclaim_grace_s=120, guest_min_runtime_s=600, lend={"cpus": 8})
    at = started + timedelta(seconds=600)  # its minimum runtime outlasts the grace
    await sim.until(
        lambda: _noted(
            sim,
            new,
            f"m-1's owner no longer lends what it holds; preempted at {at:%H:%M:%S} UTC",
        ),
        what="the note of the grace",
    )
    # No guest is placed while the lend is exceeded, and nothing fits until it is not.
    waiting = await sim.launch("cpu-1c-2g")
    await sim.wait_state(waiting, "queued")

    clock.advance(121)  # the grace is over, but not the new guest's minimum runtime
    clock.advance(480)
    preempted = await sim.wait_state(new, "preempted")
    assert preempted.reason.startswith("the machine's owner no longer lends what it holds (m-1)")
    assert preempted.metered is not None  # accounting closes its allocation here
    entry = await sim.until(
        lambda: sim.entry_if("m-1", new, lambda e: e.target is Target.parked),
        what="the new guest parked on m-1",
    )
    assert entry.resources.cpus == 0
    # The same tick judged the others: the old guest fits the lend now, the owner's stays.
    assert sim.state(old) == "running"
    assert sim.state(own) == "running"
    assert not _noted(sim, old, "no longer lends")
    assert not sim.notes(own)
    assert sim.state(waiting) == "queued"  # 8 of 8 lent cores are held


async def test_the_owners_workloads_are_never_preempted_by_a_narrowing(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    clock = ManualClock()
    gpus = [f"GPU-m-1-{i}" for i in range(2)]
    await _enrol(sim, "m-1", guest_min_runtime_s=0)
    await sim.join("m-1", enrolled=None, gpus=2)
    await start_scheduler(sqlite_url, clock=clock)
    own = await sim.launch("l40s-48gb", tenant_id=OWNER)
    await sim.wait_state(own, "scheduled")
    guest = await sim.launch()
    await sim.wait_state(guest, "scheduled")
    await _run(sim, "m-1", own, guest)

    # Nothing lent any more: the guest's GPU is not, nor the owner's.
    seen_at = clock.now
    await _enrol(sim, "m-1", guest_min_runtime_s=0, lend={"gpus": []})
    at = seen_at + timedelta(seconds=120)
    await sim.until(
        lambda: _noted(sim, guest, f"preempted at {at:%H:%M:%S} UTC unless the owner lends"),
        what="the note of the grace",
    )
    later = await sim.launch("l40s-48gb", tenant_id=OWNER)
    queued = await sim.wait_state(later, "queued")
    assert "m-1: its owner lends 0 of 2 l40s-48gb" in queued.reason

    clock.advance(121)
    await sim.wait_state(guest, "preempted")
    assert sim.state(own) == "running"
    assert _gpus(sim, "m-1", own)[0] in gpus
    assert not sim.notes(own)
    # The guest's device is free but not lent: the owner's next one still waits.
    assert sim.state(later) == "queued"


async def test_lending_again_before_the_grace_ends_cancels_the_preemption(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    clock = ManualClock()
    await _enrol(sim, "m-1", guest_min_runtime_s=0)
    await sim.join("m-1", enrolled=None, gpus=2)
    await start_scheduler(sqlite_url, clock=clock)
    guest = await sim.launch()
    await sim.wait_state(guest, "scheduled")
    await _run(sim, "m-1", guest)
    held = _gpus(sim, "m-1", guest)
    others = [f"GPU-m-1-{i}" for i in range(2) if f"GPU-m-1-{i}" not in held]

    first = clock.now
    await _enrol(sim, "m-1", guest_min_runtime_s=0, lend={"gpus": others})
    at = first + timedelta(seconds=120)
    await sim.until(
        lambda: _noted(sim, guest, f"preempted at {at:%H:%M:%S} UTC"), what="the first note"
    )
    clock.advance(60)
    await _enrol(sim, "m-1", guest_min_runtime_s=0, lend=None)
    await sim.until(
        lambda: _noted(sim, guest, "m-1's owner lends enough again; it is no longer preempted"),
        what="the cancellation",
    )

    # Past the first grace: narrowed again, its grace counts afresh from now.
    clock.advance(120)
    again = clock.now
    await _enrol(sim, "m-1", guest_min_runtime_s=0, lend={"gpus": others})
    fresh = again + timedelta(seconds=120)
    await sim.until(
        lambda: _noted(sim, guest, f"preempted at {fresh:%H:%M:%S} UTC"), what="a fresh note"
    )
    assert sim.state(guest) == "running"
