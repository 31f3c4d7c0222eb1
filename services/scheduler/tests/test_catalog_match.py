"""What a machine offers is what the scheduler places: the catalog's one match, on Macs.

A Mac's chip is one device that serves every Apple Silicon class up to its unified memory (the
api's `/v1/classes` offers the same: services/api/tests/test_catalog.py), and a workload of any
of them takes the whole chip.
"""

from __future__ import annotations

import pytest

from einsora.common.catalog import Accelerator, Catalog
from einsora.common.schemas import Gpu, Inventory, WorkloadKind, WorkloadState, utcnow
from einsora.scheduler.admission import admit
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import demand_of
from einsora.scheduler.model import Machine, Workload

CATALOG = Catalog.load()
APPLE = sorted(c.name for c in CATALOG if c.accelerator is Accelerator.apple)


def _mac(machine_id: str, gib: int) -> Inventory:
    """A Mac as its agent reports it: the chip, and the chip as one GPU of model Apple Silicon."""
    return Inventory(
        machine_id=machine_id,
        region="local",
        hostname=machine_id,
        os="darwin",
        arch="arm64",
        cpus=12,
        memory_mib=gib * 1024,
        gpus=[
            Gpu(index=0, uuid=f"apple-{machine_id}", model="Apple Silicon", memory_mib=gib * 1024)
        ],
        apple_chip="Apple M2 Max",
        unified_memory_mib=gib * 1024,
        drivers=["sim"],
    )


def _book(*machines: Inventory) -> Book:
    book = Book("local", CATALOG, sim_machines=True)
    for inventory in machines:
        machine = Machine(
            inventory.machine_id, "local", inventory, generation=1, owner_tenant="t-1"
        )
        book.add_machine(machine, new=False)
    return book


def _launch(book: Book, class_name: str, n: int = 0) -> Workload:
    workload = Workload(
        workload_id=f"w-{class_name}-{n}",
        tenant_id="t-1",
        region="local",
        kind=WorkloadKind.notebook,
        class_name=class_name,
        count=1,
        spec={},
        state=WorkloadState.pending,
        access_token="token",
        created_at=utcnow(),
        pending_since=utcnow(),
    )
    book.add_workload(workload)
    demand = demand_of(book.catalog, workload)
    assert demand is not None
    admit(book, workload, demand)
    return workload


@pytest.mark.parametrize("class_name", APPLE)
def test_a_64_gb_mac_places_every_apple_class_it_offers(class_name: str) -> None:
    mac = _mac("m-mac", 64)
    offered = {c.name for c in CATALOG.offered_by(mac) if c.accelerator is Accelerator.apple}
    assert offered == {"apple-silicon-16gb", "apple-silicon-32gb", "apple-silicon-64gb"}
    workload = _launch(_book(mac), class_name)
    if class_name in offered:
        assert workload.state is WorkloadState.scheduled
        assert workload.machine_id == "m-mac"
    else:
        assert workload.state is WorkloadState.queued
        assert "no machine in region local offers apple-silicon-128gb" in workload.reason


def test_the_chip_is_taken_whole_whatever_the_class() -> None:
    book = _book(_mac("m-mac", 64))
    first = _launch(book, "apple-silicon-32gb")
    assert first.state is WorkloadState.scheduled
    second = _launch(book, "apple-silicon-16gb", 1)
    assert second.state is WorkloadState.queued
    assert book.machines["m-mac"].booked_gpus() == {"apple-m-mac"}


def test_a_36_gb_mac_places_the_32_gb_class() -> None:
    # 36 GB is more than 10% over 32 GB: a size match alone would offer it nothing.
    workload = _launch(_book(_mac("m-pro", 36)), "apple-silicon-32gb")
    assert workload.state is WorkloadState.scheduled
