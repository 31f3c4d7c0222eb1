"""An intent that comes before its workload's create is not lost (issue 35: the chaos suite's
I3 violation, a park answered 202 and then ignored while the create, whose delivery had failed,
was placed and ran): the scheduler hands it back to the bus and applies it after the create."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from einsora.common.ids import new_id
from einsora.common.schemas import utcnow

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler


async def test_a_park_that_comes_before_its_create_is_applied_after_it(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    await start_scheduler(store_url)
    workload = new_id("workload")
    # The park is on the bus first (the create's first delivery failed), then the create.
    await sim.intent("park", workload)
    await sim.launch(workload_id=workload)
    # Placed, then the park applies (no agent plays here, so it stays parking).
    await sim.wait_state(workload, "parking")


async def test_a_remove_that_comes_before_its_create_is_applied_after_it(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    await start_scheduler(store_url)
    workload = new_id("workload")
    await sim.intent("remove", workload)
    await sim.launch(workload_id=workload)
    await sim.wait_state(workload, "removing")


async def test_a_resume_delivered_after_a_later_park_changes_nothing(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    """The chaos suite's seed 1 (I3): a resume and then a park, both answered 202; the resume's
    first delivery was held by a leader frozen past its lease, so the new leader took the park
    first (the workload was parked: nothing to do) and the resume after it, and ran what its
    owner had last asked to park."""
    await sim.join("m-1", gpus=1)
    await start_scheduler(store_url)
    workload = await sim.launch()
    await sim.wait_state(workload, "scheduled")
    await sim.report("m-1", {workload: "running"})
    await sim.wait_state(workload, "running")
    await sim.intent("park", workload)
    await sim.wait_state(workload, "parking")
    await sim.report("m-1", {workload: "parked"})
    await sim.wait_state(workload, "parked")
    resumed_at = utcnow()
    await sim.intent("park", workload, at=resumed_at + timedelta(seconds=1))  # the later one
    await sim.until(lambda: len(sim.notes(workload)) >= 1, what="the park's note")
    await sim.intent("resume", workload, at=resumed_at)  # redelivered, after it
    await sim.until(
        lambda: any("not applied: a park asked after it" in n for n in sim.notes(workload)),
        what="the resume said overtaken",
    )
    assert sim.state(workload) == "parked"
    assert sim.desired["m-1"] is not None
    entry = sim.entry("m-1", workload)
    assert entry is None or entry.target.value == "parked"
