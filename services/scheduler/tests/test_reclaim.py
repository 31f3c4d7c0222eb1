"""Owner reclaim and preemption (ADR-0017), decided by a real scheduler on a real bus.

The scheduler's wall clock is the test's own (`ManualClock`), so a grace and a minimum runtime pass
at once, without waiting for them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from einsora.common.bus import names, publish
from einsora.common.ids import new_id
from einsora.common.schemas import (
    Enrolment,
    SharingLevel,
    Target,
    WorkloadIntent,
    WorkloadKind,
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


async def _launch_as(sim: Sim, tenant_id: str) -> str:
    """A launch by another tenant than Sim's (the machine's owner)."""
    workload_id = new_id("workload")
    intent = WorkloadIntent.model_validate(
        {
            "intent_id": new_id("intent"),
            "action": "create",
            "workload_id": workload_id,
            "tenant_id": tenant_id,
            "region": "local",
            "kind": WorkloadKind.notebook,
            "class": "l40s-48gb",
            "count": 1,
            "spec": {"image": "jupyter"},
        }
    )
    await publish(
        sim.bus.js,
        names.intent_subject("local", workload_id),
        intent,
        request_id=new_id("request"),
        msg_id=intent.intent_id,
    )
    return workload_id


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


async def test_a_reclaim_preempts_guests_after_the_grace_and_their_minimum_runtime(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    clock = ManualClock()
    await _enrol(sim, "m-1")
    await sim.join("m-1", enrolled=None, gpus=4)
    await start_scheduler(sqlite_url, clock=clock)

    old = await sim.launch()
    await sim.wait_state(old, "scheduled")
    await _run(sim, "m-1", old)
    clock.advance(1000)  # it has run long past its minimum runtime
    new = await sim.launch()
    own = await _launch_as(sim, OWNER)
    await sim.wait_state(new, "scheduled")
    await sim.wait_state(own, "scheduled")
    await _run(sim, "m-1", new, own)

    reclaimed_at = clock.now
    await _enrol(sim, "m-1", reclaimed_at=reclaimed_at)
    # Each guest is told when it goes: the old one at the grace, the new one when its
    # minimum runtime is over.
    grace_end = reclaimed_at + timedelta(seconds=120)
    runtime_end = reclaimed_at + timedelta(seconds=600)
    await sim.until(
        lambda: (
            _noted(sim, old, f"the owner reclaimed m-1; preempted at {grace_end:%H:%M:%S} UTC")
            and _noted(sim, new, f"preempted at {runtime_end:%H:%M:%S} UTC unless released")
        ),
        what="the notes of the grace",
    )
    assert not sim.notes(own)

    # While it is reclaimed, no guest is placed there, and the note says why.
    waiting = await sim.launch()
    queued = await sim.wait_state(waiting, "queued")
    assert "m-1: reclaimed by its owner" in queued.reason

    clock.advance(121)
    preempted = await sim.wait_state(old, "preempted")
    assert preempted.reason.startswith("owner reclaimed the machine (m-1)")
    assert preempted.metered is not None  # accounting closes its allocation here
    assert preempted.metered.gpus == []
    await sim.until(lambda: sim.route_gone(old), what="the old guest's route deleted")
    entry = await sim.until(
        lambda: sim.entry_if("m-1", old, lambda e: e.target is Target.parked),
        what="the old guest parked on m-1 (its working directory kept)",
    )
    assert entry.resources.gpus == []
    assert sim.state(new) == "running"  # its minimum runtime is not over

    clock.advance(600)
    await sim.wait_state(new, "preempted")
    assert sim.state(own) == "running"  # the owner's own workload is never preempted
    assert sim.state(waiting) == "queued"

    # Released: the queued guest is placed again.
    await _enrol(sim, "m-1", reclaimed_at=None)
    await sim.wait_state(waiting, "scheduled")
    assert [m for m, _ in sim.placed_on(waiting)] == ["m-1"]


@pytest.mark.parametrize(
    "narrowed",
    [{"guests": []}, {"sharing": SharingLevel.private}],
    ids=["invitation-revoked", "made-private"],
)
async def test_a_guest_no_longer_shared_with_is_preempted_after_the_grace(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str, narrowed: dict[str, object]
) -> None:
    clock = ManualClock()
    await _enrol(sim, "m-1", guest_min_runtime_s=0)
    await sim.join("m-1", enrolled=None, gpus=2)
    await start_scheduler(sqlite_url, clock=clock)
    guest = await sim.launch()
    own = await _launch_as(sim, OWNER)
    await sim.wait_state(guest, "scheduled")
    await sim.wait_state(own, "scheduled")
    await _run(sim, "m-1", guest, own)

    seen_at = clock.now
    await _enrol(sim, "m-1", guest_min_runtime_s=0, **narrowed)
    at = seen_at + timedelta(seconds=120)
    await sim.until(
        lambda: _noted(
            sim,
            guest,
            f"m-1 is no longer shared with your tenant; preempted at {at:%H:%M:%S} UTC",
        ),
        what="the note of the grace",
    )
    clock.advance(60)
    # Within the grace it runs on; the owner's is untouched throughout.
    await sim.until(lambda: sim.state(guest) == "running", what="the guest still running")
    clock.advance(61)
    preempted = await sim.wait_state(guest, "preempted")
    assert preempted.reason.startswith("the machine is no longer shared with your tenant")
    assert preempted.metered is not None
    assert sim.state(own) == "running"
    await sim.until(lambda: sim.route_gone(guest), what="the guest's route deleted")


async def test_a_reclaim_by_the_agent_counts_from_its_time(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    clock = ManualClock()
    await _enrol(sim, "m-1", guest_min_runtime_s=0, reclaim_grace_s=30)
    await sim.join("m-1", enrolled=None, gpus=1)
    await start_scheduler(sqlite_url, clock=clock)
    guest = await sim.launch()
    await sim.wait_state(guest, "scheduled")
    await _run(sim, "m-1", guest)

    # The agent reclaimed it a minute ago, while the control plane could not hear it: its
    # grace is over already when its inventory arrives.
    inventory = await sim.join("m-1", enrolled=None, gpus=1)
    reclaimed = inventory.model_copy(update={"reclaimed_at": clock.now - timedelta(seconds=60)})
    await sim.machines.put(names.inventory_key("m-1"), reclaimed.to_bytes())
    preempted = await sim.wait_state(guest, "preempted")
    assert preempted.reason.startswith("owner reclaimed the machine (m-1)")
