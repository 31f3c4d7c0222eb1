"""Only enrolled machines count; their region is their enrolment's; revocation cuts them off."""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.common.testing import enrol

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler


async def test_an_unenrolled_inventory_is_ignored_until_the_machine_is_enrolled(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-stray", gpus=1, enrolled=None)
    await sim.report("m-stray", {})
    await sim.join("m-ok", gpus=1)
    await start_scheduler(sqlite_url)
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")
    assert [m for m, _ in sim.placed_on(first)] == ["m-ok"]
    # The stray machine's free GPU does not count: the next launch waits.
    second = await sim.launch()
    await sim.wait_state(second, "queued")
    assert "m-stray" not in sim.desired

    # Once the api enrols it, what it reported before counts.
    await enrol(sim.bus.js, "m-stray", owner_tenant_id="t-test")  # the tenant Sim launches as
    await sim.wait_state(second, "scheduled")
    assert [m for m, _ in sim.placed_on(second)] == ["m-stray"]


async def test_an_inventory_that_claims_another_region_changes_nothing(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    # Enrolled in `office` (another region's scheduler owns it), it claims `local`.
    await sim.join("m-office", gpus=1, region="local", enrolled="office")
    # Enrolled here, it claims `office`: it stays this region's.
    await sim.join("m-here", gpus=1, region="office", enrolled="local")
    await start_scheduler(sqlite_url)
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")
    assert [m for m, _ in sim.placed_on(first)] == ["m-here"]
    second = await sim.launch()
    await sim.wait_state(second, "queued")
    assert "m-office" not in sim.desired


async def test_a_revoked_machine_fails_its_workloads_and_takes_no_more(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    await sim.join("m-2", gpus=1)
    await start_scheduler(sqlite_url)
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")
    [(machine, _)] = sim.placed_on(first)
    other = "m-2" if machine == "m-1" else "m-1"
    await sim.report(machine, {first: "running"})
    await sim.wait_state(first, "running")
    await sim.until(lambda: sim.routes.get(first) is not None, what="route written")

    await enrol(sim.bus.js, machine, revoked=True)
    failed = await sim.wait_state(first, "failed")
    assert failed.reason.startswith(f"machine revoked: {machine}'s enrolment was revoked")
    assert failed.metered is not None  # accounting closes its allocation
    await sim.until(lambda: sim.route_gone(first), what="route deleted")

    # It still reports; nothing of it counts, and new work goes elsewhere.
    await sim.report(machine, {first: "running"})
    second = await sim.launch()
    await sim.wait_state(second, "scheduled")
    assert [m for m, _ in sim.placed_on(second)] == [other]
    third = await sim.launch()
    await sim.wait_state(third, "queued")
    assert sim.state(first) == "failed"
    kv_desired = sim.desired.get(machine)
    assert kv_desired is None or all(
        w.workload_id != second and w.workload_id != third for w in kv_desired.workloads
    )
