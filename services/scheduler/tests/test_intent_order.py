"""An intent that comes before its workload's create is not lost (issue 35: the chaos suite's
I3 violation, a park answered 202 and then ignored while the create, whose delivery had failed,
was placed and ran): the scheduler hands it back to the bus and applies it after the create."""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.common.ids import new_id

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
