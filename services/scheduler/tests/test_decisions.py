"""The decisions as plain functions over the book, without a server: best fit, the capacity
index, strict order within a pool, and how silence is judged."""

from __future__ import annotations

from datetime import timedelta

import pytest

from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    Gpu,
    GpuHealth,
    Inventory,
    Target,
    TenantQuota,
    TenantUsage,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.scheduler.admission import admit, admit_queued
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import CPU_POOL, CapacityIndex, Demand, fit, gpus_by_class
from einsora.scheduler.model import Liveness, Machine, Workload
from einsora.scheduler.observe import next_liveness

CATALOG = Catalog.load()


def _inventory(
    machine_id: str,
    gpus: int = 0,
    cpus: int = 16,
    memory_gib: int = 64,
    drivers: tuple[str, ...] = ("sim",),
) -> Inventory:
    return Inventory(
        machine_id=machine_id,
        region="local",
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=cpus,
        memory_mib=memory_gib * 1024,
        gpus=[
            Gpu(index=i, uuid=f"{machine_id}-g{i}", model="NVIDIA L40S", memory_mib=46068)
            for i in range(gpus)
        ],
        drivers=list(drivers),
    )


def _book(*machines: Inventory, owner_tenant: str | None = None) -> Book:
    book = Book("local", CATALOG, owner_tenant=owner_tenant)
    for inventory in machines:
        book.add_machine(Machine(inventory.machine_id, "local", inventory, generation=1), new=False)
    return book


def _workload(
    class_name: str, count: int = 1, age_s: float = 0, tenant_id: str = "t-1"
) -> Workload:
    return Workload(
        workload_id=f"w-{class_name}-{count}-{age_s}-{tenant_id}",
        tenant_id=tenant_id,
        region="local",
        kind=WorkloadKind.notebook,
        class_name=class_name,
        count=count,
        spec={},
        state=WorkloadState.pending,
        access_token="token",
        created_at=utcnow(),
        pending_since=utcnow() - timedelta(seconds=age_s),
    )


def _admit(book: Book, workload: Workload) -> str | None:
    book.add_workload(workload)
    demand = book.demand_of(workload)
    assert demand is not None
    admit(book, workload, demand)
    return workload.machine_id if workload.state is WorkloadState.scheduled else None


def test_demands_of_gpu_and_cpu_classes() -> None:
    gpu = Demand.of(CATALOG.get("l40s-48gb"), 2)  # type: ignore[arg-type]
    cpu = Demand.of(CATALOG.get("cpu-2c-4g"), 3)  # type: ignore[arg-type]
    assert (gpu.gpu, gpu.count, gpu.pool) == (True, 2, "l40s-48gb")
    assert (cpu.gpu, cpu.cpus, cpu.memory_mib, cpu.pool) == (False, 6, 12288, CPU_POOL)


def test_quarantined_and_unknown_devices_are_not_offered() -> None:
    inventory = _inventory("m-1", gpus=3).model_copy(
        update={
            "gpus": [
                Gpu(index=0, uuid="a", model="NVIDIA L40S", memory_mib=46068),
                Gpu(
                    index=1,
                    uuid="b",
                    model="NVIDIA L40S",
                    memory_mib=46068,
                    health=GpuHealth.quarantined,
                ),
                Gpu(index=2, uuid="c", model="Some Future GPU", memory_mib=1),
            ]
        }
    )
    assert gpus_by_class(inventory, CATALOG) == {"l40s-48gb": ["a"]}


def test_best_fit_takes_the_fullest_machine_that_fits() -> None:
    book = _book(_inventory("m-4", gpus=4), _inventory("m-2", gpus=2), _inventory("m-1", gpus=1))
    assert _admit(book, _workload("l40s-48gb", 2, 3)) == "m-2"
    assert _admit(book, _workload("l40s-48gb", 1, 2)) == "m-1"
    assert _admit(book, _workload("l40s-48gb", 3, 1)) == "m-4"
    assert _admit(book, _workload("l40s-48gb", 1, 0)) == "m-4"
    booked = [u for m in book.machines.values() for u in m.booked_gpus()]
    assert len(booked) == len(set(booked)) == 7


def test_cpu_best_fit_needs_cores_and_memory() -> None:
    book = _book(
        _inventory("m-wide", cpus=32, memory_gib=8), _inventory("m-deep", cpus=8, memory_gib=64)
    )
    # m-wide has the cores but not the memory.
    assert _admit(book, _workload("cpu-8c-32g", 1, 1)) == "m-deep"
    assert _admit(book, _workload("cpu-2c-4g", 1, 0)) == "m-wide"


def test_a_pool_is_strictly_first_in_first_out() -> None:
    book = _book(_inventory("m-1", gpus=2))
    holder = _workload("l40s-48gb", 1, 10)
    assert _admit(book, holder) == "m-1"
    big = _workload("l40s-48gb", 2, 5)
    small = _workload("l40s-48gb", 1, 1)
    assert _admit(book, big) is None
    # One device is free, but the older 2-device request comes first.
    assert _admit(book, small) is None
    assert [w.workload_id for w in book.queue["l40s-48gb"]] == [big.workload_id, small.workload_id]
    # Another pool is not blocked.
    assert _admit(book, _workload("cpu-1c-2g")) == "m-1"


def test_a_request_no_machine_could_ever_hold_does_not_block_its_pool() -> None:
    book = _book(_inventory("m-1", gpus=2))
    huge = _workload("l40s-48gb", 8, 5)
    assert _admit(book, huge) is None
    assert "(the largest has 2)" in huge.reason
    assert _admit(book, _workload("l40s-48gb", 1, 1)) == "m-1"


def test_capacity_index_files_only_placeable_machines() -> None:
    book = _book(_inventory("m-1", gpus=2))
    machine = book.machines["m-1"]
    index = CapacityIndex()
    index.update(machine)
    demand = Demand.of(CATALOG.get("l40s-48gb"), 1)  # type: ignore[arg-type]
    assert index.best_fit(demand) == "m-1"
    assert fit(machine, demand) is not None
    machine.liveness = Liveness.suspect
    index.update(machine)
    assert index.best_fit(demand) is None
    machine.liveness = Liveness.alive
    machine.settle_generation = 5
    index.update(machine)
    assert index.best_fit(demand) is None  # back, but has not applied what stops its old work


@pytest.mark.parametrize(
    ("current", "silent", "expected"),
    [
        (Liveness.alive, 10, Liveness.alive),
        (Liveness.alive, 30, Liveness.suspect),
        (Liveness.suspect, 119, Liveness.suspect),
        (Liveness.suspect, 120, Liveness.lost),
        (Liveness.alive, 500, Liveness.lost),
        (Liveness.lost, 60, Liveness.lost),  # only a report brings it back
        (Liveness.lost, 1, Liveness.alive),
    ],
)
def test_silence_is_judged_by_time(current: Liveness, silent: float, expected: Liveness) -> None:
    assert next_liveness(current, silent, 30, 120) is expected


# --- the trust filter (issue 9, hole 3): weak isolation only for the machine owner's tenant ---


def test_a_machine_with_only_weak_isolation_takes_only_its_owners_tenant() -> None:
    book = _book(_inventory("m-host", gpus=2, drivers=("process",)), owner_tenant="t-owner")
    guest = _workload("l40s-48gb", tenant_id="t-guest", age_s=10)
    assert _admit(book, guest) is None
    assert guest.state is WorkloadState.queued
    assert "m-host" in guest.reason
    assert "weak isolation" in guest.reason
    # The guest waiting at the head of the pool does not hold back the owner's own workload.
    own = _workload("l40s-48gb", tenant_id="t-owner")
    assert _admit(book, own) == "m-host"
    assert guest.state is WorkloadState.queued


def test_a_guest_goes_to_a_machine_with_strong_isolation() -> None:
    book = _book(
        _inventory("m-host", gpus=1, drivers=("process",)),
        _inventory("m-vm", gpus=2, drivers=("process", "libvirt")),
        owner_tenant="t-owner",
    )
    # Best fit alone would pick m-host (one free device); trust sends the guest to m-vm.
    assert _admit(book, _workload("l40s-48gb", tenant_id="t-guest")) == "m-vm"
    assert _admit(book, _workload("l40s-48gb", tenant_id="t-owner", age_s=1)) == "m-host"


def test_without_a_machine_owner_weak_machines_take_nobody() -> None:
    book = _book(_inventory("m-host", cpus=8, drivers=("process",)))
    workload = _workload("cpu-2c-4g")
    assert _admit(book, workload) is None
    assert "no tenant" in workload.reason


def _endpoint(name: str, runtime: str, replicas: int = 1, age_s: float = 0) -> Workload:
    workload = _workload("cpu-2c-4g", 1, age_s)
    workload.workload_id = f"w-{name}-{age_s}"
    workload.kind = WorkloadKind.endpoint
    workload.name = name
    workload.spec = {"model": "/models/m.gguf", "runtime": runtime, "replicas": replicas}
    return workload


def test_a_machine_without_the_runtime_is_unfit_and_the_note_says_so() -> None:
    plain = _inventory("m-plain")
    served = _inventory("m-llama").model_copy(update={"runtimes": ["command", "llamacpp"]})
    book = _book(plain)
    waiting = _endpoint("chat", "llamacpp")
    assert _admit(book, waiting) is None
    assert "can serve the llamacpp runtime" in waiting.reason
    assert "einsora-agent[llamacpp]" in waiting.reason
    # A workload that needs no runtime is not held up behind it.
    assert _admit(book, _workload("cpu-2c-4g", 1, 0)) == "m-plain"
    book = _book(plain, served)
    assert _admit(book, _endpoint("chat", "llamacpp", age_s=1)) == "m-llama"
    # `command` needs only a driver that runs it.
    assert _admit(_book(plain), _endpoint("own", "command")) == "m-plain"


def test_replicas_of_an_endpoint_go_to_different_machines_while_there_are_some() -> None:
    machines = [
        _inventory(f"m-{i}").model_copy(update={"runtimes": ["llamacpp"]}) for i in range(2)
    ]
    book = _book(*machines)
    placed = [_admit(book, _endpoint("chat", "llamacpp", 3, age_s=i)) for i in range(3)]
    assert set(placed[:2]) == {"m-0", "m-1"}  # apart while they can be
    assert placed[2] in {"m-0", "m-1"}  # then together rather than waiting
    # Another endpoint is not kept apart from them: best fit as ever.
    other = [_admit(book, _endpoint("other", "llamacpp", 1, age_s=9 + i)) for i in range(2)]
    assert other[0] == other[1]


def test_a_tenant_past_its_quota_waits_with_a_note_and_holds_up_nobody() -> None:
    book = _book(_inventory("m-1", gpus=4))
    book.quotas["t-1"] = TenantQuota(tenant_id="t-1", max_gpus={"l40s-48gb": 1})
    first = _workload("l40s-48gb", 1, 30)
    assert _admit(book, first) == "m-1"
    over = _workload("l40s-48gb", 1, 20)
    assert _admit(book, over) is None
    assert over.reason.startswith("quota: 1 of 1 l40s-48gb in use by your tenant; it starts when")
    # Another tenant's younger workload of the same pool is not held up behind it.
    assert _admit(book, _workload("l40s-48gb", 1, 10, tenant_id="t-2")) == "m-1"
    # The first one's device released: the waiting one is admitted.
    machine, row = book.row_of(first)  # type: ignore[misc]
    book.release(machine, row, Target.removed)
    admit_queued(book)
    assert over.state is WorkloadState.scheduled


def test_gpu_hours_of_the_last_week_past_the_quota_keep_a_tenant_waiting() -> None:
    book = _book(_inventory("m-1", gpus=2))
    book.quotas["t-1"] = TenantQuota(tenant_id="t-1", gpu_hours_per_7d=10)
    book.usage["t-1"] = TenantUsage(tenant_id="t-1", gpu_hours_7d=10.5)
    waiting = _workload("l40s-48gb", 1, 5)
    assert _admit(book, waiting) is None
    assert "used 10.5 of 10 GPU-hours in the last 7 days" in waiting.reason
    assert _admit(book, _workload("cpu-2c-4g")) == "m-1"  # a CPU class is not GPU-metered
    book.usage["t-1"] = TenantUsage(tenant_id="t-1", gpu_hours_7d=9.0)
    admit_queued(book)
    assert waiting.state is WorkloadState.scheduled


def test_a_released_device_goes_to_the_tenant_with_less_recent_use_then_the_oldest() -> None:
    book = _book(_inventory("m-1", gpus=1))
    book.usage["t-heavy"] = TenantUsage(tenant_id="t-heavy", decayed_gpu_hours=40.0)
    book.usage["t-light"] = TenantUsage(tenant_id="t-light", decayed_gpu_hours=2.0)
    holder = _workload("l40s-48gb", 1, 100, tenant_id="t-other")
    assert _admit(book, holder) == "m-1"
    # The heavy tenant asked first, twice; the light one later.
    heavy = [_workload("l40s-48gb", 1, 50 - i, tenant_id="t-heavy") for i in range(2)]
    light = [_workload("l40s-48gb", 1, 10 - i, tenant_id="t-light") for i in range(2)]
    for workload in (*heavy, *light):
        assert _admit(book, workload) is None
    assert "1 workload ahead" in light[1].reason  # its position, by fair share
    order = []
    running = holder
    for _ in range(4):
        machine, row = book.row_of(running)  # type: ignore[misc]
        book.release(machine, row, Target.removed)
        running.state = WorkloadState.removed
        admit_queued(book)
        [running] = [w for w in (*heavy, *light) if w.state is WorkloadState.scheduled]
        running.state = WorkloadState.running
        order.append(running)
    assert order == [light[0], light[1], heavy[0], heavy[1]]
