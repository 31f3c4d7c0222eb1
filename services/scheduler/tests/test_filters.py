"""The filters say why, by name: a workload that only quarantined devices keep waiting is told
so, not that no machine offers its class (ADR-0030, filters/health.py)."""

from __future__ import annotations

from einsora.common.catalog import Catalog
from einsora.common.schemas import Gpu, GpuHealth, Inventory, WorkloadKind, WorkloadState, utcnow
from einsora.scheduler.admission import admit
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import demand_of
from einsora.scheduler.model import Machine, Workload

CATALOG = Catalog.load()


def _book(quarantined: tuple[int, ...]) -> Book:
    inventory = Inventory(
        machine_id="m-1",
        region="local",
        hostname="m-1",
        os="linux",
        arch="x86_64",
        cpus=16,
        memory_mib=64 * 1024,
        gpus=[
            Gpu(
                index=i,
                uuid=f"m-1-g{i}",
                model="NVIDIA L40S",
                memory_mib=46068,
                health=GpuHealth.quarantined if i in quarantined else GpuHealth.ok,
            )
            for i in range(2)
        ],
        drivers=["sim"],
    )
    book = Book("local", CATALOG, owner_tenant="t-1", sim_machines=True)
    book.add_machine(Machine("m-1", "local", inventory, generation=1), new=False)
    return book


def _launch(book: Book, n: int, count: int) -> Workload:
    workload = Workload(
        workload_id=f"w-{n}",
        tenant_id="t-1",
        region="local",
        kind=WorkloadKind.notebook,
        class_name="l40s-48gb",
        count=count,
        spec={},
        state=WorkloadState.pending,
        access_token="token",
        created_at=utcnow(),
        pending_since=utcnow(),
    )
    book.add_workload(workload)
    demand = demand_of(CATALOG, workload)
    assert demand is not None
    admit(book, workload, demand)
    return workload


def test_a_workload_only_quarantined_devices_keep_waiting_is_told_so() -> None:
    book = _book(quarantined=(1,))
    both = _launch(book, 1, count=2)
    assert both.state is WorkloadState.queued
    assert both.reason.startswith(
        "machines that would hold it have quarantined devices: m-1: 1 of its 2 l40s-48gb "
        "quarantined; it waits until an operator clears them"
    )
    one = _launch(book, 2, count=1)  # the healthy device is given; a waiting one holds nothing
    assert (one.state, one.machine_id) == (WorkloadState.scheduled, "m-1")


def test_without_quarantine_a_count_too_large_is_the_machine_size() -> None:
    book = _book(quarantined=())
    too_many = _launch(book, 1, count=3)
    assert "no machine in region local has 3 l40s-48gb at all (the largest has 2)" in (
        too_many.reason
    )
