"""Scoring: among the machines that pass every filter, the one a workload goes to (ADR-0003).

A resuming workload goes back to the machine that holds its working directory when it fits
there; otherwise the best fit (the machine left with the fewest free devices of the class, or
the fewest free cores: `CapacityIndex.best_fit`), and for a replica of an endpoint, a machine
without another replica of it when there is one (spread).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from einsora.common.schemas import WorkloadKind, WorkloadState
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand, Grant
from einsora.scheduler.filters import capacity, region
from einsora.scheduler.model import Workload

_HOLDS_A_PLACE = frozenset({WorkloadState.scheduled, WorkloadState.starting, WorkloadState.running})


def choose(
    book: Book,
    workload: Workload,
    demand: Demand,
    wants: frozenset[str],
    held: AbstractSet[str] = frozenset(),
) -> Grant | None:
    """What the best machine of `wants` not in `held` gives now (None: none has room)."""
    if held and wants <= held:
        return None
    home = book.machines.get(workload.machine_id) if workload.machine_id else None
    if home is not None and home.machine_id in wants and home.machine_id not in held:
        grant = capacity.grant(home, demand) if region.now(home) else None
        if grant is not None:
            return grant

    def allowed(machine_id: str) -> bool:
        return machine_id in wants and machine_id not in held

    best = None
    others = replica_machines(book, workload)
    if others:
        best = book.index.best_fit(demand, lambda m: m not in others and allowed(m))
    if best is None:
        best = book.index.best_fit(demand, allowed)
    return None if best is None else capacity.grant(book.machines[best], demand)


def replica_machines(book: Book, workload: Workload) -> set[str]:
    """The machines other replicas of this endpoint are on (same tenant and name)."""
    if workload.kind is not WorkloadKind.endpoint or not workload.name:
        return set()
    replicas = workload.spec.get("replicas", 1)
    if not isinstance(replicas, int) or replicas <= 1:
        return set()
    return {
        w.machine_id
        for w in book.workloads.values()
        if w.machine_id is not None
        and w is not workload
        and w.name == workload.name
        and w.tenant_id == workload.tenant_id
        and w.kind is WorkloadKind.endpoint
        and w.state in _HOLDS_A_PLACE
    }
