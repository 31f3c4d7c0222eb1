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
    SharingLevel,
    Target,
    TenantQuota,
    TenantUsage,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.scheduler.admission import admit, admit_queued
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import (
    CPU_POOL,
    CapacityIndex,
    Demand,
    demand_of,
    fit,
    gpus_by_class,
)
from einsora.scheduler.model import Liveness, Machine, Workload
from einsora.scheduler.observe import next_liveness
from einsora.scheduler.trust import Trust, trust_level

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


def _book(*machines: Inventory, owner_tenant: str | None = None, shared: bool = True) -> Book:
    """A book over these machines; `shared`: each is shared with a community pool, so every
    tenant may use the strongly isolated ones (the trust matrix's tests set their own)."""
    book = Book(
        "local", CATALOG, owner_tenant=owner_tenant, community_pool=shared, sim_machines=True
    )
    for inventory in machines:
        machine = Machine(inventory.machine_id, "local", inventory, generation=1)
        if shared:
            machine.sharing = SharingLevel.community
        book.add_machine(machine, new=False)
    return book


def _workload(
    class_name: str,
    count: int = 1,
    age_s: float = 0,
    tenant_id: str = "t-1",
    kind: WorkloadKind = WorkloadKind.notebook,
) -> Workload:
    return Workload(
        workload_id=f"w-{class_name}-{count}-{age_s}-{tenant_id}",
        tenant_id=tenant_id,
        region="local",
        kind=kind,
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
    demand = demand_of(book.catalog, workload)
    assert demand is not None
    admit(book, workload, demand)
    return workload.machine_id if workload.state is WorkloadState.scheduled else None


def test_demands_of_gpu_and_cpu_classes() -> None:
    gpu = Demand.of(CATALOG.get("l40s-48gb"), 2)  # type: ignore[arg-type]
    cpu = Demand.of(CATALOG.get("cpu-2c-4g"), 3)  # type: ignore[arg-type]
    assert (gpu.gpu, gpu.count, gpu.pool) == (True, 2, "l40s-48gb")
    assert (cpu.gpu, cpu.cpus, cpu.memory_mib, cpu.pool) == (False, 6, 12288, CPU_POOL)


def test_quarantined_devices_are_not_offered_and_unknown_ones_are_automatic_classes() -> None:
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
                Gpu(index=2, uuid="c", model="Some Future GPU", memory_mib=96 * 1024),
            ]
        }
    )
    catalog = Catalog.load()
    assert gpus_by_class(inventory, catalog) == {
        "l40s-48gb": ["a"],
        "some-future-gpu-96gb": ["c"],  # offered the day it is plugged in
    }
    automatic = catalog.get("some-future-gpu-96gb")
    assert automatic is not None
    assert automatic.automatic
    # An operator who wants only the classes they configured turns automatic classes off.
    assert gpus_by_class(inventory, Catalog(automatic=False)) == {"l40s-48gb": ["a"]}


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


# --- the trust matrix (issues 9 and 15): who may use a machine, with which isolation -------


def _shared(
    book: Book,
    machine_id: str,
    owner: str,
    sharing: SharingLevel = SharingLevel.private,
    guests: tuple[str, ...] = (),
) -> None:
    """What the machine's enrolment says (the scheduler reads it from the enrolments bucket)."""
    machine = book.machines[machine_id]
    machine.owner_tenant, machine.sharing, machine.guests = owner, sharing, frozenset(guests)
    book.machine_changed(machine)


@pytest.mark.parametrize(
    ("sharing", "guests", "pool", "level"),
    [
        (SharingLevel.private, (), False, None),
        (SharingLevel.private, ("t-guest",), False, None),  # invited, but not shared (yet)
        (SharingLevel.invite_only, (), False, None),
        (SharingLevel.invite_only, ("t-guest",), False, Trust.invited),
        (SharingLevel.community, (), False, None),  # this instance runs no community pool
        (SharingLevel.community, (), True, Trust.community),
        (SharingLevel.community, ("t-guest",), True, Trust.invited),
    ],
)
@pytest.mark.parametrize(("drivers", "strong"), [(("process",), False), (("libvirt",), True)])
def test_the_trust_matrix_decides_who_runs_where_and_the_note_says_why(
    sharing: SharingLevel,
    guests: tuple[str, ...],
    pool: bool,
    level: Trust | None,
    drivers: tuple[str, ...],
    strong: bool,
) -> None:
    book = _book(_inventory("m-alice", gpus=2, drivers=drivers), shared=False)
    book.community_pool = pool
    _shared(book, "m-alice", "t-alice", sharing, guests)
    machine = book.machines["m-alice"]
    assert trust_level(machine, "t-alice", None, pool) is Trust.owner
    assert trust_level(machine, "t-guest", None, pool) is level

    # A vm where the machine runs VMs, a notebook where it runs processes.
    kind = WorkloadKind.vm if strong else WorkloadKind.notebook
    guest = _workload("l40s-48gb", tenant_id="t-guest", age_s=10, kind=kind)
    placed = _admit(book, guest)
    if level is not None and strong:
        assert placed == "m-alice"
    else:
        assert placed is None
        assert guest.state is WorkloadState.queued
        if level is None:
            assert "m-alice: not shared with your tenant" in guest.reason or (
                "community pool this instance does not run" in guest.reason
            )
        else:
            assert (
                "m-alice: only weak isolation (process) for a notebook without a container "
                "image; guests need strong" in guest.reason
            )
    # The owner runs on it with any driver, and a waiting guest does not hold the owner back.
    own = _workload("l40s-48gb", tenant_id="t-alice", kind=kind)
    assert _admit(book, own) == "m-alice"


def test_a_guest_goes_to_a_machine_with_strong_isolation() -> None:
    book = _book(
        _inventory("m-host", gpus=1, drivers=("process",)),
        _inventory("m-vm", gpus=2, drivers=("libvirt",)),
        shared=False,
    )
    for machine in ("m-host", "m-vm"):
        _shared(book, machine, "t-owner", SharingLevel.invite_only, ("t-guest",))
    # Best fit alone would pick m-host (one free device); trust sends the guest to m-vm.
    vm = WorkloadKind.vm
    assert _admit(book, _workload("l40s-48gb", tenant_id="t-guest", kind=vm)) == "m-vm"
    assert _admit(book, _workload("l40s-48gb", tenant_id="t-owner", age_s=1)) == "m-host"


def test_an_invited_user_runs_there_and_their_tenant_mates_do_not() -> None:
    book = _book(_inventory("m-vm", gpus=2, drivers=("libvirt",)), shared=False)
    _shared(book, "m-vm", "t-owner", SharingLevel.invite_only)
    machine = book.machines["m-vm"]
    machine.guest_users = frozenset({"u-ada"})
    book.machine_changed(machine)
    assert trust_level(machine, "t-studio", None, False, "u-ada") is Trust.invited
    assert trust_level(machine, "t-studio", None, False, "u-bo") is None

    mate = _workload("l40s-48gb", tenant_id="t-studio", age_s=2, kind=WorkloadKind.vm)
    mate.user_id = "u-bo"
    assert _admit(book, mate) is None
    assert "m-vm: not shared with your tenant or you" in mate.reason
    hers = _workload("l40s-48gb", tenant_id="t-studio", age_s=1, kind=WorkloadKind.vm)
    hers.workload_id, hers.user_id = "w-ada", "u-ada"
    assert _admit(book, hers) == "m-vm"


def test_a_gpu_is_never_booked_to_two_tenants_at_once() -> None:
    book = _book(_inventory("m-vm", gpus=2, drivers=("libvirt",)))
    book.community_pool = True
    _shared(book, "m-vm", "t-owner", SharingLevel.community)
    placed = [
        _admit(book, _workload("l40s-48gb", tenant_id=t, age_s=i, kind=WorkloadKind.vm))
        for i, t in enumerate(["t-a", "t-owner", "t-b", "t-a", "t-owner"])
    ]
    assert placed.count("m-vm") == 2  # two devices, two workloads; the rest wait
    booked = [row.gpus for row in book.machines["m-vm"].rows.values() if row.gpus]
    assert sorted(g for gpus in booked for g in gpus) == ["m-vm-g0", "m-vm-g1"]
    assert all(len(gpus) == 1 for gpus in booked)


def test_a_machine_without_an_owner_takes_nobody_but_the_cells_owner() -> None:
    book = _book(_inventory("m-host", cpus=8, drivers=("process",)), shared=False)
    workload = _workload("cpu-2c-4g")
    assert _admit(book, workload) is None
    assert "m-host: not shared with your tenant" in workload.reason
    owned = _book(
        _inventory("m-host", cpus=8, drivers=("process",)), owner_tenant="t-1", shared=False
    )
    assert _admit(owned, _workload("cpu-2c-4g")) == "m-host"


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
