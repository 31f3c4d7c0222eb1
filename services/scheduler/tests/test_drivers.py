"""Which driver runs a workload on a machine, and what the placement note says (issue 21)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    DriverReport,
    Inventory,
    SharingLevel,
    Virtualization,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.scheduler import drivers
from einsora.scheduler.admission import admit
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import demand_of
from einsora.scheduler.model import Machine, Workload

CATALOG = Catalog.load()


def _inventory(
    machine_id: str, have: tuple[str, ...], virtualization: Virtualization | None = None
) -> Inventory:
    engines = []
    if "libvirt" in have:
        engines.append(DriverReport(name="libvirt", available=True, virtualization=virtualization))
    return Inventory(
        machine_id=machine_id,
        region="local",
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=8,
        memory_mib=32768,
        drivers=list(have),
        engines=engines,
    )


@pytest.mark.parametrize(
    ("kind", "spec", "have", "owner", "chosen"),
    [
        (WorkloadKind.vm, {}, ("process", "libvirt"), True, "libvirt"),
        (WorkloadKind.vm, {}, ("process", "libvirt"), False, "libvirt"),
        (WorkloadKind.vm, {}, ("process", "docker"), True, None),
        (WorkloadKind.notebook, {}, ("process", "libvirt"), True, "process"),
        (WorkloadKind.notebook, {}, ("process", "libvirt"), False, None),
        (WorkloadKind.endpoint, {"image": "srv:1"}, ("process", "docker"), True, "docker"),
        (WorkloadKind.endpoint, {"image": "srv:1"}, ("process", "docker"), False, None),
        (
            WorkloadKind.endpoint,
            {"image": "srv:1"},
            ("docker", "docker-kata"),
            False,
            "docker-kata",
        ),
        (WorkloadKind.endpoint, {"image": "srv:1"}, ("docker", "docker-kata"), True, "docker"),
        (
            WorkloadKind.notebook,
            {"image": "nb:1", "driver": "docker-kata"},
            ("docker", "docker-kata"),
            True,
            "docker-kata",
        ),
        (WorkloadKind.notebook, {"driver": "docker"}, ("process", "docker"), True, None),
        (WorkloadKind.vm, {}, ("sim",), False, "sim"),
    ],
)
def test_the_driver_follows_the_kind_the_spec_and_the_trust(
    kind: WorkloadKind,
    spec: dict[str, Any],
    have: tuple[str, ...],
    owner: bool,
    chosen: str | None,
) -> None:
    inventory = _inventory("m-1", have)
    choice = drivers.choose(inventory, kind, spec, owner=owner, sim_machines=True)
    assert (None if choice is None else choice.driver) == chosen
    can = drivers.can_run(inventory, kind, spec, owner=owner, sim_machines=True)
    assert can is (chosen is not None)


def test_why_none_fits_names_what_is_missing_or_too_weak() -> None:
    process_only = _inventory("m-1", ("process",))
    vm = drivers.refusal(process_only, WorkloadKind.vm, {}, owner=True, sim_machines=False)
    assert vm == "no driver here runs a vm (it needs libvirt; it has process)"
    guest = drivers.refusal(
        process_only, WorkloadKind.notebook, {}, owner=False, sim_machines=False
    )
    assert guest == (
        "only weak isolation (process) for a notebook without a container image; guests need strong"
    )
    asked = drivers.refusal(
        process_only, WorkloadKind.vm, {"driver": "docker"}, owner=True, sim_machines=False
    )
    assert asked == "spec.driver docker cannot run a vm (it runs with libvirt)"


def _workload(kind: WorkloadKind, tenant_id: str, workload_id: str) -> Workload:
    return Workload(
        workload_id=workload_id,
        tenant_id=tenant_id,
        region="local",
        kind=kind,
        class_name="cpu-2c-4g",
        count=1,
        spec={},
        state=WorkloadState.pending,
        access_token="token",
        created_at=utcnow(),
        pending_since=utcnow() - timedelta(seconds=1),
    )


def _admit(book: Book, workload: Workload) -> None:
    book.add_workload(workload)
    demand = demand_of(book.catalog, workload)
    assert demand is not None
    admit(book, workload, demand)


def test_a_guests_vm_goes_to_libvirt_its_notebook_is_refused_and_the_notes_say_why() -> None:
    book = Book("local", CATALOG)
    inventory = _inventory("m-lab", ("process", "libvirt"), Virtualization.emulated)
    machine = Machine("m-lab", "local", inventory, generation=1)
    machine.owner_tenant = "t-owner"
    machine.sharing = SharingLevel.invite_only
    machine.guests = frozenset({"t-guest"})
    machine.enrolled = True
    book.add_machine(machine, new=False)

    vm = _workload(WorkloadKind.vm, "t-guest", "w-vm")
    _admit(book, vm)
    assert vm.state is WorkloadState.scheduled
    assert machine.rows["w-vm"].driver == "libvirt"
    assert vm.reason.endswith(
        "; driver libvirt: a vm runs in a VM (strong isolation), software emulation (m-lab has "
        "no KVM, so it runs slowly)"
    )

    notebook = _workload(WorkloadKind.notebook, "t-guest", "w-nb")
    _admit(book, notebook)
    assert notebook.state is WorkloadState.queued
    assert "w-nb" not in machine.rows
    assert (
        "m-lab: only weak isolation (process) for a notebook without a container image; guests "
        "need strong" in notebook.reason
    )

    own = _workload(WorkloadKind.notebook, "t-owner", "w-own")
    _admit(book, own)
    assert own.state is WorkloadState.scheduled
    assert machine.rows["w-own"].driver == "process"
    assert own.reason.endswith(
        "; driver process: a notebook without a container image runs as a local process (weak "
        "isolation; your own machine)"
    )
