"""A workload's route, written from its agent's report and believed only about the machine
itself (ADR-0026)."""

from __future__ import annotations

from einsora.common.schemas import Endpoint, Route
from einsora.scheduler import reasons
from einsora.scheduler.book import Book
from einsora.scheduler.model import Machine, Workload


def set_route(book: Book, workload: Workload, machine: Machine, endpoint: Endpoint) -> None:
    """Write the workload's route from its agent's report: a direct machine's route points at
    its enrolled address, and a port that is the control plane's own (or no workload's) is
    refused: the route is deleted and the timeline says why, once per report."""
    host, why = endpoint.host, None
    if not machine.tunnel:
        if machine.address is None:
            why = "it was enrolled without an address the control plane reaches it at"
        host = machine.address or host
    ports = [endpoint.port, *endpoint.ports.values()]
    why = why or book.own_ports.first_refusal(ports)
    if why is not None:
        book.put_route(workload, endpoint, None)
        book.note(workload, reasons.route_refused(machine.machine_id, why))
        return
    book.put_route(
        workload,
        endpoint,
        Route(
            workload_id=workload.workload_id,
            tenant_id=workload.tenant_id,
            kind=workload.kind,
            machine_id=machine.machine_id,
            host=host,
            port=endpoint.port,
            token=workload.access_token,
            name=workload.name,
            runtime=endpoint.runtime,
            via_tunnel=machine.tunnel,
            ports=dict(endpoint.ports),
        ),
    )
