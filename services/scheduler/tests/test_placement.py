"""Admission and placement against a real bus and real stores: a launch becomes a row in a
machine's desired state, and the agent's reports move it through its states."""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.common.bus import names

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler


async def test_a_launch_is_placed_then_follows_the_agent_to_running(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-big", gpus=4)
    await sim.join("m-small", gpus=2)
    await start_scheduler(store_url)

    workload = await sim.launch("l40s-48gb", request_id="req-launch-1")
    scheduled = await sim.wait_state(workload, "scheduled")

    # Best fit: the machine left with the fewest free devices of the class.
    assert scheduled.placement is not None
    assert scheduled.placement.machine == "m-small"
    assert scheduled.placement.placed_class == "l40s-48gb"
    # The note names the device it was given, as `nvidia-smi -L` lists it.
    assert scheduled.reason == (
        "placed on m-small (best fit: 2 of 2 l40s-48gb free); driver sim: nothing runs (a "
        "simulated machine); given GPU-m-small-0"
    )
    assert scheduled.request_id == "req-launch-1"
    assert sim.event_headers[scheduled.event_id][names.REQUEST_ID_HEADER] == "req-launch-1"
    assert sim.event_headers[scheduled.event_id][names.MSG_ID_HEADER] == scheduled.event_id
    entry = await sim.until(lambda: sim.entry("m-small", workload), what="desired entry")
    assert entry.target.value == "running"
    assert entry.resources.gpus == ["GPU-m-small-0"]
    assert entry.access_token
    assert len(entry.access_token) >= 40
    assert entry.spec == {"image": "jupyter"}

    await sim.report("m-small", {workload: "starting"})
    await sim.wait_state(workload, "starting")
    await sim.report("m-small", {workload: "running"})
    running = await sim.wait_state(workload, "running")
    assert running.request_id == "req-launch-1"
    route = await sim.until(lambda: sim.routes.get(workload), what="route")
    assert (route.host, route.port, route.machine_id) == ("127.0.0.1", 18000, "m-small")
    assert route.token == entry.access_token

    await sim.report("m-small", {workload: "failed"}, reasons={workload: "exited with code 3"})
    failed = await sim.wait_state(workload, "failed")
    assert failed.reason == "failed on m-small: exited with code 3"
    await sim.until(
        lambda: workload in sim.routes and sim.routes[workload] is None, what="route gone"
    )
    entry = await sim.until(
        lambda: sim.entry_if("m-small", workload, lambda e: not e.resources.gpus),
        what="devices released",
    )
    assert entry.target.value == "parked"  # stopped, its directory kept for a look

    seqs = [e.seq for e in sim.events[workload]]
    assert seqs == sorted(seqs) == list(range(1, len(seqs) + 1))


async def test_a_gpu_is_never_shared(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=4)
    await sim.join("m-2", gpus=4)
    await start_scheduler(sqlite_url)
    workloads = [await sim.launch("l40s-48gb", count) for count in (1, 2, 1, 3, 2)]

    for w in workloads[:4]:
        await sim.wait_state(w, "scheduled")
    queued = await sim.wait_state(workloads[4], "queued")
    assert "no machine in region local has 2 l40s-48gb free" in queued.reason

    uuids = [
        uuid for d in sim.desired.values() if d for w in d.workloads for uuid in w.resources.gpus
    ]
    assert len(uuids) == len(set(uuids)) == 7
    for w, count in zip(workloads[:4], (1, 2, 1, 3), strict=True):
        [(machine, entry)] = sim.placed_on(w)
        assert len(entry.resources.gpus) == count
        assert all(u.startswith(f"GPU-{machine}-") for u in entry.resources.gpus)


async def test_a_cpu_class_books_cores_and_memory(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-cpu", gpus=0, cpus=8, memory_gib=32)
    await start_scheduler(sqlite_url)
    first = await sim.launch("cpu-4c-16g")
    second = await sim.launch("cpu-2c-4g", 2)
    third = await sim.launch("cpu-1c-2g")

    placed = await sim.wait_state(first, "scheduled")
    assert placed.reason == (
        "placed on m-cpu (best fit: 8 cores and 32 GiB of 8 cores and 32 GiB free); driver sim: "
        "nothing runs (a simulated machine)"
    )
    await sim.wait_state(second, "scheduled")
    queued = await sim.wait_state(third, "queued")
    assert queued.reason.startswith(
        "no machine in region local has 1 cores and 2 GiB (1 cpu-1c-2g) free; none ahead"
    )
    entry = sim.entry("m-cpu", second)
    assert entry is not None
    assert (entry.resources.cpus, entry.resources.memory_mib, entry.resources.gpus) == (4, 8192, [])


async def test_quarantined_gpus_and_other_regions_are_not_used(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-sick", gpus=2, quarantined=(0,))
    await sim.join("m-away", gpus=8, region="elsewhere")
    await start_scheduler(sqlite_url)
    first = await sim.launch()
    second = await sim.launch()

    await sim.wait_state(first, "scheduled")
    await sim.wait_state(second, "queued")
    assert sim.entry("m-sick", first) is not None
    assert sim.entry("m-sick", first).resources.gpus == ["GPU-m-sick-1"]  # type: ignore[union-attr]
    assert "m-away" not in sim.desired


async def test_an_unknown_class_fails_with_a_reason(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1")
    await start_scheduler(sqlite_url)
    workload = await sim.launch("tpu-v9")
    failed = await sim.wait_state(workload, "failed")
    assert failed.reason.startswith("class tpu-v9 is not in the catalog")


async def test_a_request_larger_than_any_machine_waits_without_blocking_others(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await start_scheduler(sqlite_url)
    huge = await sim.launch("l40s-48gb", 8)
    small = await sim.launch("l40s-48gb", 1)
    nothing = await sim.launch("a100-80gb", 1)

    waiting = await sim.wait_state(huge, "queued")
    assert waiting.reason.startswith(
        "no machine in region local has 8 l40s-48gb at all (the largest has 2)"
    )
    await sim.wait_state(small, "scheduled")
    none = await sim.wait_state(nothing, "queued")
    assert none.reason.startswith("no machine in region local offers a100-80gb")

    await sim.join("m-8", gpus=8)
    placed = await sim.wait_state(huge, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-8"
