"""Walking a workload's fallback chain: at admission, at resume, as its timer runs, and when a
region it may go on to comes back (ADR-0022).

The walk tries the targets its chain has reached (`fallback.reachable`), in order. A target of
this region puts the workload in that target's pool and admits the pool, so it is placed there
only in its turn (admission.py); a target of another region hands it over to that region's
scheduler (`handover.hop`) when that scheduler is up. Each target left behind is a note ("l40s-
48gb: none free in local (3 of 3 in use); trying a100-80gb"); a walk that reaches the end of
what its chain allows leaves the workload queued in every pool it reached, with the whole
explanation, and admission places it on the first of them that frees, in chain order.

A running workload never moves by itself. One that is preempted, or whose machine is revoked,
walks its chain again when it opted in to one (`after_eviction`).
"""

from __future__ import annotations

from einsora.common.schemas import WorkloadState
from einsora.scheduler import admission, fallback, handover, reasons, regions, why
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand, demand_of
from einsora.scheduler.fallback import Target
from einsora.scheduler.model import Workload

_WAITING = frozenset({WorkloadState.pending, WorkloadState.queued})
_EVICTED = frozenset({WorkloadState.preempted, WorkloadState.failed})


def admit(book: Book, workload: Workload, demand: Demand | None = None) -> None:
    """A workload's admission (a create, a resume, an eviction, a hand-over). One without a
    chain is a chain of one: admitted at the class it asked for (`demand`, when the caller
    has it), here (a class the catalog lacks fails before it comes here)."""
    if workload.chain is None:
        demand = demand or demand_of(book.catalog, workload)
        assert demand is not None
        admission.admit(book, workload, demand)
        return
    walk(book, workload)


def restart(workload: Workload) -> None:
    """A resume or an eviction walks its chain again from the first target."""
    chain = workload.chain
    if chain is None:
        return  # a chain of one has nowhere else to start
    chain.start, chain.reached, chain.since = 0, -1, None
    chain.explained, chain.optional = [], False


def walk(book: Book, workload: Workload) -> None:
    """Go along the chain as far as its timer allows: placed, handed over, or queued."""
    chain = workload.chain
    assert chain is not None
    found = fallback.targets(workload)
    limit = fallback.reachable(workload, book.clock())
    previous = None
    if chain.reached >= chain.start:
        previous = _clause(book, workload, found[chain.reached])
    i = max(chain.reached + 1, chain.start)
    while i <= limit:
        target = found[i]
        if target.region != book.region and regions.is_up(book, target.region):
            tried = found[chain.start : chain.reached + 1]
            explained = [*chain.explained, *(_clause(book, workload, t) for t in tried)]
            note = reasons.handed_over(previous, target.region)
            handover.hop(book, workload, target, note, explained)
            return
        if previous is not None:
            book.note(workload, reasons.trying(previous, target.label()))
        chain.reached = i
        book.save_workload(workload)
        if target.region == book.region:
            if target.replicas is not None:
                chain.optional = chain.optional or chain.replica > target.replicas
            elif (demand := fallback.demand_for(book, workload, target)) is not None:
                _wait_in(book, workload, demand.pool)
                admission.admit_pool(book, demand.pool)
                if workload.workload_id not in book.chained:
                    return  # placed: admission took it out of every queue
        previous = _clause(book, workload, target)
        i += 1
    _queue(book, workload)


def requeue(book: Book, workload: Workload) -> None:
    """A waiting workload loaded from the store waits again in the pools of the targets it
    reached here (a chained one's timer walks it on if it reached none yet)."""
    for target in fallback.targets_here(book, workload):
        demand = fallback.demand_for(book, workload, target)
        if demand is not None:
            book.enqueue(workload, demand.pool)
    if workload.chain is not None:
        book.chained[workload.workload_id] = workload


def _clause(book: Book, workload: Workload, target: Target) -> str:
    """Why `target` has no room for the workload now."""
    if target.region != book.region:
        return reasons.step_region_down(target.label(), regions.why_down(book, target.region))
    if target.replicas is not None:
        chain = workload.chain
        assert chain is not None
        return reasons.step_fewer_replicas(chain.replica, target.replicas)
    return why.explain(book, workload, target)


def _wait_in(book: Book, workload: Workload, pool: str) -> None:
    """Wait in `pool` too (once), and among the chained workloads the timer looks at."""
    book.chained[workload.workload_id] = workload
    book.enqueue(workload, pool)


def _queue(book: Book, workload: Workload) -> None:
    """Nothing it reached has room: it waits in every pool it reached, with the whole
    explanation (and when its timer reaches the next step)."""
    chain = workload.chain
    assert chain is not None
    found = fallback.targets(workload)
    if chain.since is None:
        chain.since = book.clock()
    book.chained[workload.workload_id] = workload
    clauses = [*chain.explained]
    clauses += [_clause(book, workload, t) for t in found[chain.start : chain.reached + 1]]
    at = fallback.next_at(workload)
    label = found[chain.reached + 1].label() if at is not None else None
    reason = reasons.chain_exhausted(clauses, label, f"{at:%H:%M:%S}" if at else None)
    book.save_workload(workload)
    if workload.state is WorkloadState.pending or workload.state in _EVICTED:
        book.transition(workload, WorkloadState.queued, reason)
    elif workload.reason != reason:
        workload.reason = reason
        book.note(workload, reason)


def advance(book: Book) -> None:
    """On a tick: each queued chained workload whose timer reached a further target walks on."""
    now = book.clock()
    for workload in list(book.chained.values()):
        chain = workload.chain
        if chain is None or workload.state not in _WAITING:
            continue
        if fallback.reachable(workload, now) > chain.reached:
            walk(book, workload)


def region_up(book: Book, region: str) -> None:
    """A region's scheduler is up again: each workload that went past a target there (while
    it was down) goes back to that target and walks on from it."""
    for workload in list(book.chained.values()):
        chain = workload.chain
        if chain is None or workload.state not in _WAITING:
            continue
        found = fallback.targets(workload)
        passed = [
            t.index
            for t in found[chain.start : chain.reached + 1]
            if t.region == region and t.region != book.region
        ]
        if passed:
            chain.reached = passed[0] - 1
            walk(book, workload)


def after_eviction(book: Book, workload: Workload, why: str) -> None:
    """A preempted workload, or one whose machine was revoked, walks its chain again when it
    opted in to one; otherwise it waits for its user's resume, as before."""
    if workload.chain is None or workload.state not in _EVICTED:
        return
    book.note(workload, reasons.evicted_moves(why))
    restart(workload)
    workload.pending_since = book.clock()
    walk(book, workload)
