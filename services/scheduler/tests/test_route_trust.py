"""A route is believed only about the machine it runs on (issue 34, N1 and N3; ADR-0026): a
direct machine's routes point at its enrolled address whatever its agent reports, and a port of
the control plane's own, a privileged one or none at all is refused, with a note, once."""

from __future__ import annotations

from datetime import timedelta

from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    Endpoint,
    EventKind,
    Inventory,
    Route,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.common.settings import Settings
from einsora.common.targets import OwnPorts
from einsora.scheduler.book import Book
from einsora.scheduler.model import Machine, Workload
from einsora.scheduler.routes import set_route

SETTINGS = Settings(api_port=8080, nats_port=4222, database_url="postgresql://db:6432/einsora")


def _machine(machine_id: str, *, tunnel: bool = False, address: str | None = None) -> Machine:
    inventory = Inventory(
        machine_id=machine_id,
        region="local",
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=8,
        memory_mib=8192,
    )
    machine = Machine(machine_id, "local", inventory, generation=1)
    machine.tunnel, machine.address = tunnel, address
    return machine


def _running(book: Book) -> Workload:
    workload = Workload(
        workload_id="w-1",
        tenant_id="t-1",
        region="local",
        kind=WorkloadKind.endpoint,
        class_name="cpu-1c-2g",
        count=1,
        spec={},
        state=WorkloadState.running,
        access_token="token",
        created_at=utcnow(),
        pending_since=utcnow() - timedelta(seconds=1),
    )
    book.workloads[workload.workload_id] = workload
    return workload


def _book() -> Book:
    book = Book("local", Catalog())
    book.own_ports = OwnPorts.of(SETTINGS)
    return book


def _route(book: Book) -> Route | None:
    return book.changes.routes["w-1"]


def _notes(book: Book) -> list[str]:
    return [e.event.reason for e in book.changes.events if e.event.kind is EventKind.note]


def test_a_direct_machines_route_points_at_its_enrolled_address_not_its_report() -> None:
    book = _book()
    machine = _machine("m-direct", address="10.20.30.40")
    workload = _running(book)
    # The agent says its workload answers at the cloud metadata address: the route goes to the
    # machine itself, on the port it said.
    set_route(book, workload, machine, Endpoint(host="169.254.169.254", port=40123))
    route = _route(book)
    assert route is not None
    assert (route.host, route.port, route.via_tunnel) == ("10.20.30.40", 40123, False)
    assert _notes(book) == []


def test_a_tunnelled_machines_route_keeps_the_address_on_that_machine() -> None:
    book = _book()
    workload = _running(book)
    set_route(
        book, workload, _machine("m-far", tunnel=True), Endpoint(host="127.0.0.1", port=41000)
    )
    route = _route(book)
    assert route is not None
    assert (route.host, route.via_tunnel) == ("127.0.0.1", True)


def test_the_control_planes_own_ports_and_privileged_ones_are_refused_once() -> None:
    for port, why in (
        (8080, "port 8080 is one of the control plane's own"),
        (4222, "port 4222 is one of the control plane's own"),
        (6432, "port 6432 is one of the control plane's own"),  # the store, from its URL
        (22, "port 22 is not a port a workload's driver opens"),
    ):
        book = _book()
        workload = _running(book)
        machine = _machine("m-direct", address="127.0.0.1")
        set_route(
            book, workload, machine, Endpoint(host="127.0.0.1", port=40000, ports={"ssh": port})
        )
        assert _route(book) is None, port
        notes = _notes(book)
        assert len(notes) == 1
        assert why in notes[0]
        assert notes[0].startswith("not reachable through the proxy or the gateway")


def test_a_direct_machine_enrolled_without_an_address_gets_no_route() -> None:
    book = _book()
    workload = _running(book)
    set_route(book, workload, _machine("m-old"), Endpoint(host="10.0.0.9", port=40000))
    assert _route(book) is None
    assert "enrolled without an address" in _notes(book)[0]
