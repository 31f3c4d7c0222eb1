"""Why a workload waits: the filters' refusals, said once for every workload (ADR-0030).

`queued` is the timeline's sentence for a workload whose target here (a workload without a
fallback chain is a chain of one) has no room; `explain` is the clause for one target of a
chain, which `chain.py` strings together. Both ask the same filters in the same order (quota,
then the lasting filters over every machine, then room now) and count "how many are ahead" the
same way (`order.ahead`: only workloads that hold a machine this one could use).
"""

from __future__ import annotations

from einsora.scheduler import order, reasons
from einsora.scheduler import trust as matrix
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand, free_cpus, free_memory_mib, holds_emptied
from einsora.scheduler.fallback import Target, demand_for
from einsora.scheduler.filters import capacity, health, lend, quota, region, trust, usable
from einsora.scheduler.model import Machine, Workload


def queued(book: Book, workload: Workload, demand: Demand) -> str:
    """Why the workload waits at the class it asked for here."""
    over = quota.refusal(book, workload, demand)
    if over is not None:
        return over
    anywhere = usable.fits_anywhere(book, demand)
    runtime_is_why = demand.runtime is not None and not anywhere
    if runtime_is_why and usable.fits_anywhere(book, demand.without_runtime()):
        return reasons.runtime_missing(book.region, demand)
    wants = usable.machines(book, workload, demand)
    if anywhere and not wants:
        return matrix.refusal(refusals(book, workload, demand))
    if not anywhere:
        sick = [r for m in _sorted(book) if (r := health.refusal(m, demand, book.catalog))]
        if sick:
            return reasons.quarantined(sick)
        if demand.gpu:
            largest = max(
                (len(m.gpus_by_class.get(demand.class_name, [])) for m in book.machines.values()),
                default=0,
            )
        else:
            largest = 0
        return reasons.never_fits(book.region, demand, largest)
    return reasons.queued(book.region, demand, order.ahead(book, workload, demand.pool, wants))


def refusals(book: Book, workload: Workload, demand: Demand) -> list[str]:
    """Why each machine that would hold the workload, emptied, with all of its inventory (or
    would but for quarantined devices), does not take it: the first lasting filter that says
    no, each naming its machine."""
    found = []
    for m in _sorted(book):
        if not region.lasting(m):
            continue
        sick = health.refusal(m, demand, book.catalog)
        if sick is not None:
            found.append(sick)
        elif not trust.passes(book, m, workload):
            if holds_emptied(m, demand, lent=False):
                found.append(trust.refusal(book, m, workload))
        elif not lend.passes(m, demand) and holds_emptied(m, demand, lent=False):
            found.append(lend.refusal(m, demand))
    return found


def explain(book: Book, workload: Workload, target: Target) -> str:
    """Why `target` (of this region) has no room for the workload now, as a clause."""
    label = target.label()
    demand = demand_for(book, workload, target)
    if demand is None:
        return reasons.step_unknown_class(label)
    over = quota.refusal(book, workload, demand)
    if over is not None:
        return reasons.step_over_quota(label, over)
    if target.machine is not None:
        return _explain_machine(book, workload, target, demand)
    if demand.gpu:
        return _explain_gpu(book, workload, target, demand)
    return _explain_cpu(book, workload, target, demand)


def _explain_machine(book: Book, workload: Workload, target: Target, demand: Demand) -> str:
    label = target.label()
    machine = book.machines.get(target.machine or "")
    if machine is None or not region.lasting(machine):
        return reasons.step_no_such_machine(label, book.region)
    if not trust.passes(book, machine, workload):
        why = trust.refusal(book, machine, workload)
        return f"{label}: {why.split(': ', 1)[-1]}"
    if not region.now(machine):
        return reasons.step_machine_away(label, region.refusal(machine))
    sick = health.refusal(machine, demand, book.catalog)
    if sick is not None:
        return reasons.step_never_fits(label, sick.split(": ", 1)[-1])
    if not lend.passes(machine, demand):
        return reasons.step_never_fits(label, f"has no {_what(demand)}")
    free = book.index.free_devices(machine.machine_id, demand.class_name)
    return capacity.refusal(label, machine, demand, free)


def _explain_gpu(book: Book, workload: Workload, target: Target, demand: Demand) -> str:
    label = target.label()
    offers = [m for m in book.machines.values() if demand.class_name in m.lent_gpus_by_class]
    if not offers:
        return reasons.step_never_fits(label, f"no machine in {book.region} offers it")
    allowed = [m for m in offers if trust.passes(book, m, workload)]
    if not allowed:
        return reasons.step_never_fits(
            label, f"no machine in {book.region} that has it may take your workloads"
        )
    wants = usable.machines(book, workload, demand)
    if not wants:
        return reasons.step_never_fits(
            label, f"no machine in {book.region} has {demand.count} of it"
        )
    placeable = [m for m in allowed if m.placeable]
    total = sum(len(m.lent_gpus_by_class[demand.class_name]) for m in placeable)
    free = sum(book.index.free_devices(m.machine_id, demand.class_name) for m in placeable)
    if free >= demand.count:
        ahead = order.ahead(book, workload, demand.pool, wants)
        return reasons.step_behind(label, f"{free} free in {book.region}", ahead)
    return reasons.step_gpus_busy(label, f"in {book.region}", free, total, demand.count)


def _explain_cpu(book: Book, workload: Workload, target: Target, demand: Demand) -> str:
    label = target.label()
    if not usable.fits_anywhere(book, demand):
        return reasons.step_never_fits(
            label, f"no machine in {book.region} has {_what(demand)} in total"
        )
    wants = usable.machines(book, workload, demand)
    if not wants:
        return reasons.step_never_fits(
            label, f"no machine in {book.region} that has it may take your workloads"
        )
    fits_now = any(
        m.placeable and free_cpus(m) >= demand.cpus and free_memory_mib(m) >= demand.memory_mib
        for m in (book.machines[i] for i in wants)
    )
    if fits_now:
        ahead = order.ahead(book, workload, demand.pool, wants)
        return reasons.step_behind(label, f"room in {book.region}", ahead)
    return reasons.step_cpu_busy(label, f"in {book.region}", _what(demand))


def _sorted(book: Book) -> list[Machine]:
    return sorted(book.machines.values(), key=lambda m: m.machine_id)


def _what(demand: Demand) -> str:
    if demand.gpu:
        return f"{demand.count} {demand.class_name}"
    return f"{demand.cpus:g} cores and {demand.memory_mib / 1024:g} GiB"
