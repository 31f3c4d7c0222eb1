"""Machines that fall silent and come back, and a `machines` bucket that loses its keys."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from nats.js.errors import KeyNotFoundError, NotFoundError

from einsora.common.bus import names
from einsora.common.schemas import DesiredState, TenantQuota

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler


async def test_a_silent_machine_is_suspect_then_lost_then_reconciled_when_back(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    # Joined into a running scheduler, its silence counts from now, not from before a start
    # that on a busy host alone takes longer than the suspect limit.
    await start_scheduler(sqlite_url, suspect_after_s=0.6, lost_after_s=1.5)
    await sim.join("m-1", gpus=1)
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")
    await sim.report("m-1", {first: "running"})
    await sim.wait_state(first, "running")
    second = await sim.launch()
    await sim.wait_state(second, "queued")
    running_generation = sim.desired["m-1"].generation  # type: ignore[union-attr]

    # m-1 stops reporting.
    await sim.until(lambda: sim.notes(first), within_s=5, what="suspect note")
    assert sim.notes(first)[0].startswith("m-1 has not reported for ")
    lost = await sim.wait_state(first, "failed", within_s=5)
    assert lost.reason.startswith("machine lost: m-1 has not reported for ")
    # Accounting meters from these events: running from the report's arrival, with what it
    # holds; lost at its last heartbeat (before it was even suspect), not when declared lost.
    [running] = [
        e for e in sim.events[first] if e.state.value == "running" and e.kind.value == "transition"
    ]
    assert running.metered is not None
    assert (running.metered.machine, running.metered.gpus) == ("m-1", ["GPU-m-1-0"])
    [suspect] = [e for e in sim.events[first] if e.kind.value == "note"]
    assert running.at <= lost.at < suspect.at
    assert lost.metered is not None
    entry = await sim.until(
        lambda: sim.entry_if("m-1", first, lambda e: not e.resources.gpus), what="released"
    )
    assert entry.target.value == "parked"  # when it comes back, the agent stops it
    await sim.until(lambda: sim.route_gone(first), what="route deleted")
    assert sim.state(second) == "queued"  # a lost machine takes no work

    # m-1 comes back, still running the old generation: reconciled, not yet given new work.
    await sim.report("m-1", {first: "running"}, generation=running_generation)
    await sim.until(lambda: len(sim.notes(first)) == 2, what="back note")
    assert sim.notes(first)[1] == (
        "m-1 is back; it is told to stop what it still runs for this workload"
    )
    assert sim.state(first) == "failed"
    assert sim.state(second) == "queued"

    # Once it has applied the current desired state (the old workload stopped), it takes work.
    await sim.report("m-1", {first: "parked"})
    placed = await sim.wait_state(second, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-1"
    assert sim.entry("m-1", second).resources.gpus == ["GPU-m-1-0"]  # type: ignore[union-attr]


async def test_a_suspect_machine_that_reports_again_keeps_its_workloads(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await start_scheduler(sqlite_url, suspect_after_s=0.5, lost_after_s=60)
    await sim.join("m-1", gpus=1)  # into a running scheduler: silent from now, not from before
    workload = await sim.launch()
    await sim.wait_state(workload, "scheduled")
    await sim.report("m-1", {workload: "running"})
    await sim.wait_state(workload, "running")
    await sim.until(lambda: sim.notes(workload), within_s=5, what="suspect note")
    await sim.report("m-1", {workload: "running"})
    await sim.until(lambda: len(sim.notes(workload)) == 2, what="reports again")
    assert sim.notes(workload)[1] == "m-1 reports again"
    assert sim.state(workload) == "running"


async def test_deleted_desired_keys_are_rebuilt_from_the_store(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await sim.join("m-2", gpus=2)
    await start_scheduler(store_url)
    workloads = [await sim.launch() for _ in range(3)]
    for w in workloads:
        await sim.wait_state(w, "scheduled")
    before = {m: d for m, d in sim.desired.items() if d is not None}
    assert set(before) == {"m-1", "m-2"}

    # A delete leaves a marker that watches see; a purge of the stream's subject leaves nothing.
    await sim.machines.delete(names.desired_key("m-1"))
    await sim.until(lambda: sim.desired.get("m-1"), what="m-1 rebuilt")
    await sim.bus.js.purge_stream(
        names.MACHINES.stream, subject=names.MACHINES.key_subject(names.desired_key("m-2"))
    )
    writes = sim.desired_writes
    await sim.until(lambda: sim.desired_writes > writes, what="m-2 rebuilt")
    for machine in ("m-1", "m-2"):
        rebuilt = sim.desired[machine]
        assert rebuilt is not None
        assert rebuilt.generation == before[machine].generation
        assert rebuilt.workloads == before[machine].workloads


async def test_a_deleted_machines_bucket_is_recreated_and_rebuilt(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await start_scheduler(sqlite_url)
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")
    before = await sim.until(lambda: sim.entry("m-1", first), what="desired")
    await sim.stop()  # its watchers end with the bucket

    await sim.bus.js.delete_stream(names.MACHINES.stream)

    async def rebuilt() -> DesiredState | None:
        with contextlib.suppress(NotFoundError, KeyNotFoundError):
            kv = await sim.bus.js.key_value(names.MACHINES.name)
            entry = await kv.get(names.desired_key("m-1"))
            if entry.value:
                return DesiredState.from_bytes(entry.value)
        return None

    desired = await sim.eventually(rebuilt, within_s=10, what="desired state rewritten")
    assert [w.workload_id for w in desired.workloads] == [first]
    assert desired.workloads[0] == before
    # The machine is still known to the store: new work still lands on it.
    machines = await sim.bus.js.key_value(names.MACHINES.name)
    sim.machines = machines
    await sim.start()
    second = await sim.launch()
    placed = await sim.wait_state(second, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-1"
    assert sim.entry("m-1", second).resources.gpus == ["GPU-m-1-1"]  # type: ignore[union-attr]


async def test_unreadable_machine_values_are_ignored(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.machines.put(names.inventory_key("m-bad"), b"{not json")
    await sim.machines.put(names.observed_key("m-bad"), b'{"machine_id": "m-other"}')
    await sim.join("m-1", gpus=1)
    # An inventory under one key that names another machine is refused.
    impostor = (await sim.join("m-2", gpus=8)).model_copy(update={"machine_id": "m-1"})
    await sim.machines.put(names.inventory_key("m-2"), impostor.to_bytes())
    await start_scheduler(sqlite_url)
    workload = await sim.launch("l40s-48gb", 8)
    queued = await sim.wait_state(workload, "queued")
    assert "(the largest has 1)" in queued.reason


async def test_a_quarantined_gpu_fails_the_workload_using_it(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await start_scheduler(sqlite_url)
    workload = await sim.launch()
    await sim.wait_state(workload, "scheduled")
    await sim.report("m-1", {workload: "running"})
    await sim.wait_state(workload, "running")

    await sim.join("m-1", gpus=2, quarantined=(0,))
    failed = await sim.wait_state(workload, "failed")
    assert failed.reason.startswith("GPU GPU-m-1-0 on m-1 is quarantined or gone")
    await sim.until(lambda: sim.route_gone(workload), what="route deleted")
    # The healthy device is given again; the quarantined one never.
    again = await sim.launch()
    await sim.wait_state(again, "scheduled")
    assert sim.entry("m-1", again).resources.gpus == ["GPU-m-1-1"]  # type: ignore[union-attr]
    third = await sim.launch()
    await sim.wait_state(third, "queued")


async def test_a_quota_set_through_the_bus_holds_launches_until_it_allows_them(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await start_scheduler(sqlite_url)
    usage = await sim.bus.js.key_value(names.USAGE_KV.name)
    quota = TenantQuota(tenant_id="t-test", max_gpus={"l40s-48gb": 1})
    await usage.put(names.tenant_quota_key("t-test"), quota.to_bytes())
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")
    second = await sim.launch()
    held = await sim.wait_state(second, "queued")
    assert held.reason.startswith("quota: 1 of 1 l40s-48gb in use by your tenant")
    # The operator raises the quota: admitted at once, on the device that was free all along.
    raised = TenantQuota(tenant_id="t-test", max_gpus={"l40s-48gb": 2})
    await usage.put(names.tenant_quota_key("t-test"), raised.to_bytes())
    await sim.wait_state(second, "scheduled")
