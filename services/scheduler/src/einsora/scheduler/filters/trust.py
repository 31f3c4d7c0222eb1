"""Filter 4, trust and isolation: may the machine take this tenant's (and user's) workload,
with a driver that isolates it as its trust level needs (the matrix: `scheduler/trust.py`)?"""

from __future__ import annotations

from einsora.scheduler import drivers
from einsora.scheduler import trust as matrix
from einsora.scheduler.book import Book
from einsora.scheduler.model import Machine, Workload

QUESTION = "May it take this tenant's workload, isolated as its trust level needs?"


def passes(book: Book, machine: Machine, workload: Workload) -> bool:
    return matrix.may_run(
        machine,
        workload.tenant_id,
        book.owner_tenant,
        book.community_pool,
        workload.user_id,
        sim_machines=book.sim_machines,
        kind=workload.kind,
        spec=workload.spec,
    )


def refusal(book: Book, machine: Machine, workload: Workload) -> str:
    """`m-1: not shared with your tenant or you`, and the like."""
    return matrix.why_not(
        machine,
        workload.tenant_id,
        book.owner_tenant,
        book.community_pool,
        workload.user_id,
        sim_machines=book.sim_machines,
        kind=workload.kind,
        spec=workload.spec,
    )


def driver_for(book: Book, machine: Machine, workload: Workload) -> drivers.Choice | None:
    """The driver `machine` runs `workload` with (None: it may not)."""
    level = matrix.trust_level(
        machine, workload.tenant_id, book.owner_tenant, book.community_pool, workload.user_id
    )
    if level is None:
        return None
    return drivers.choose(
        machine.inventory,
        workload.kind,
        workload.spec,
        owner=level is matrix.Trust.owner,
        sim_machines=book.sim_machines,
    )
