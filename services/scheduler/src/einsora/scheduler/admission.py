"""Admission and placement: a pending workload goes to a machine now, or waits its turn.

The rule (ADR-0003): a resuming workload goes back to the machine that holds its working
directory when it fits there; otherwise, and for every new workload, the best-fit machine (the
one left with the fewest free devices of the class, or the fewest free cores). When nothing
fits, the workload is queued. Each pool (a GPU class, or all CPU classes together) is a strict
queue: a workload is never placed while one ahead of it in its pool waits, so a large request is
not starved by a stream of small ones. Ahead means older in the CPU pool; in a GPU pool, of a
tenant with less decayed recent GPU use, then older (fair share, ADR-0014). A workload that no
machine of the region could hold even when empty, or that its tenant's quota holds, does not
block the others.

A workload with a fallback chain (ADR-0022) waits in the pool of each target its chain has
reached here; in each it takes its turn in the same order, and it takes the first of its
targets, in chain order, that fits and whose pool it has its turn in (`fallback.py`).
"""

from __future__ import annotations

from einsora.common.schemas import Placement, Target, WorkloadState
from einsora.scheduler import drivers, fallback, quotas, reasons, trust
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import (
    Demand,
    Grant,
    fit,
    free_cpus,
    free_memory_mib,
    serves,
)
from einsora.scheduler.model import Liveness, Machine, Row, Workload


def admit(book: Book, workload: Workload, demand: Demand) -> None:
    """Place a pending workload now if its turn has come and something fits, else queue it."""
    book.enqueue(workload, demand.pool)
    admit_pool(book, demand.pool)
    if workload.state is WorkloadState.pending:
        book.transition(workload, WorkloadState.queued, _queued_reason(book, workload, demand))


def admit_queued(book: Book) -> None:
    """Capacity freed somewhere: admit what now fits, oldest first in each pool."""
    for pool in list(book.queue):
        admit_pool(book, pool)


def admit_pool(book: Book, pool: str) -> None:
    queue = book.queue.get(pool)
    if not queue:
        return
    for workload in book.admission_order(pool):
        if workload.chain is not None:
            # Its chain's targets decide (fallback.py); it holds the pool while one of its
            # targets here would take it once room frees.
            if not _admit_chained(book, workload, pool) and fallback.holds(book, workload, pool):
                break
            continue
        demand = book.demand_of(workload)
        assert demand is not None  # unknown classes fail before they are queued
        over = quotas.refusal(book, workload, demand)
        if over is not None:
            # Its tenant's quota, not capacity, holds it: it does not hold up the others.
            if workload.state is WorkloadState.queued and workload.reason != over:
                workload.reason = over
                book.note(workload, over)
            continue
        grant = choose(book, workload, demand)
        if grant is not None:
            queue.remove(workload)
            place(book, workload, demand, grant)
            continue
        if book.ever_fits_for(workload, demand):
            break  # strict order: nothing after it in this pool goes first
        # No machine it may use would ever hold it: when that reason changed (a machine was
        # shared with its tenant, narrowed, or joined), its timeline says so.
        why = _queued_reason(book, workload, demand)
        if workload.state is WorkloadState.queued and workload.reason != why:
            workload.reason = why
            book.note(workload, why)
    if not queue:
        book.queue.pop(pool, None)


def _admit_chained(book: Book, workload: Workload, pool: str) -> bool:
    """Place a chained workload at the first target it has reached here that fits now and
    whose pool it has its turn in; whether it was placed."""
    for target in fallback.tried_here(book, workload):
        demand = fallback.demand_for(book, workload, target)
        if demand is None or quotas.refusal(book, workload, demand) is not None:
            continue
        if target.machine is not None:
            grant = fallback.pinned_grant(book, workload, target, demand)
        else:
            grant = choose(book, workload, demand)
        if grant is None or fallback.gives_way(book, workload, demand.pool):
            continue
        if demand.pool != pool and not fallback.has_turn(book, workload, demand.pool):
            continue
        book.dequeue(workload)
        place(book, workload, demand, grant, target.index)
        return True
    return False


def choose(book: Book, workload: Workload, demand: Demand) -> Grant | None:
    """The machine holding its working directory if it fits there, else the best fit."""
    home = book.machines.get(workload.machine_id) if workload.machine_id else None
    if home is not None and home.placeable and book.may_run(home, workload):
        grant = fit(home, demand)
        if grant is not None:
            return grant
    best = _best_fit(book, workload, demand)
    if best is None:
        return None
    return fit(book.machines[best], demand)


def _best_fit(book: Book, workload: Workload, demand: Demand) -> str | None:
    """The best fit among machines this workload may use, and that serve its runtime; for a
    replica of an endpoint, a machine without another replica of it when there is one."""

    def allowed(machine_id: str) -> bool:
        machine = book.machines[machine_id]
        return serves(machine, demand) and book.may_run(machine, workload)

    others = book.replica_machines(workload)
    if others:
        apart = book.index.best_fit(demand, lambda m: m not in others and allowed(m))
        if apart is not None:
            return apart
    return book.index.best_fit(demand, allowed)


def place(
    book: Book, workload: Workload, demand: Demand, grant: Grant, step: int | None = None
) -> None:
    """Book the grant in the machine's desired state and say where, and why, in the timeline.
    `step`: the target of its fallback chain it is placed at (None: it has no chain)."""
    machine = book.machines[grant.machine_id]
    reason = _placed_reason(book, workload, machine, demand)
    if step is not None:
        steps = len(fallback.targets(workload)) - 1
        reason = reasons.placed_as(reason, machine.machine_id, demand.class_name, step, steps)
    choice = book.driver_for(machine, workload)
    if choice is not None:  # sim too: the timeline says that nothing runs (issue 34, N9)
        reason = f"{reason}; {drivers.note(choice)}"
    reason = _with_devices(reason, machine, grant, None if choice is None else choice.driver)
    home = book.row_of(workload)
    if home is not None and home[0] is not machine:
        old_machine, old_row = home
        book.release(old_machine, old_row, Target.removed)
    book.set_row(
        machine,
        Row(
            workload.workload_id,
            Target.running,
            gpus=list(grant.gpus),
            cpus=grant.cpus,
            memory_mib=grant.memory_mib,
            driver=None if choice is None else choice.driver,
        ),
    )
    workload.machine_id = machine.machine_id
    workload.placed_class = demand.class_name
    workload.pending_since = None
    book.transition(
        workload,
        WorkloadState.scheduled,
        reason,
        Placement(region=book.region, machine=machine.machine_id, placed_class=demand.class_name),
    )


def _with_devices(reason: str, machine: Machine, grant: Grant, driver: str | None) -> str:
    """The placement note, naming the devices booked (a MIG slice as one) and, for a process
    on a machine with GPUs whose device nodes are not confined, that only its environment
    holds it to its own."""
    if grant.gpus:
        by_uuid = {g.uuid: g for g in machine.inventory.gpus}
        given = [by_uuid[u] for u in grant.gpus if u in by_uuid]
        reason = f"{reason}; {reasons.devices_given(given)}"
    if driver == drivers.PROCESS and machine.inventory.gpus:
        confinement = machine.inventory.device_confinement
        if confinement is None or confinement.method is None:
            note = "" if confinement is None else confinement.note
            reason = f"{reason}; {reasons.devices_unconfined(note, len(grant.gpus))}"
    return reason


def _placed_reason(book: Book, workload: Workload, machine: Machine, demand: Demand) -> str:
    home = workload.machine_id
    if home == machine.machine_id:
        return reasons.placed_on_disk_machine(machine.machine_id)
    if demand.gpu:
        total = len(machine.lent_gpus_by_class.get(demand.class_name, []))
        free = book.index.free_devices(machine.machine_id, demand.class_name)
        text = reasons.placed(machine.machine_id, str(free), f"{total} {demand.class_name}")
    else:
        cores = f"{free_cpus(machine):g}"
        memory = f"{free_memory_mib(machine) / 1024:g}"
        size = f"{machine.lent_cpus:g} cores and {machine.lent_memory_mib / 1024:g} GiB"
        text = reasons.placed(machine.machine_id, f"{cores} cores and {memory} GiB", size)
    if home is not None and home in book.machines and book.row_of(workload) is not None:
        why = _why_not_home(book.machines[home])
        return reasons.moved_from_disk_machine(machine.machine_id, home, why) + f" ({text})"
    return text


def _why_not_home(machine: Machine) -> str:
    if not machine.placeable:
        return "is not reporting" if machine.liveness is not Liveness.alive else "is settling"
    return "has no room for it now"


def _queued_reason(book: Book, workload: Workload, demand: Demand) -> str:
    over = quotas.refusal(book, workload, demand)
    if over is not None:
        return over
    runtime_is_why = demand.runtime is not None and not book.ever_fits(demand)
    if runtime_is_why and book.ever_fits(demand.without_runtime()):
        return reasons.runtime_missing(book.region, demand)
    if book.ever_fits(demand) and not book.ever_fits_for(workload, demand):
        return trust.refusal(book.distrusted_fits(workload, demand))
    if not book.ever_fits(demand):
        if demand.gpu:
            largest = max(
                (len(m.gpus_by_class.get(demand.class_name, [])) for m in book.machines.values()),
                default=0,
            )
        else:
            largest = 0
        return reasons.never_fits(book.region, demand, largest)
    ahead = book.queued_ahead(workload, demand.pool)
    return reasons.queued(book.region, demand, ahead)
