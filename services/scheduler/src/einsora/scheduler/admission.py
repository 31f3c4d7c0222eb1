"""Admission: a pending workload goes to a machine now, or waits its turn (ADR-0003, ADR-0030).

A pass over a pool's queue takes its workloads in the pool's order (`order.py`: fair share, then
age). For each, the filters (`filters/`) find the machines it may use and `score.py` picks among
those with room now; a workload that finds none waits, and **holds** the machines it may use:
no workload behind it in the pool takes room on them, so a large request is not starved by a
stream of small ones. It holds nothing else, so it never holds back another tenant's launch on
capacity it could not use itself. A workload its tenant's quota holds, or that no machine would
ever hold, holds nothing.

A workload without a fallback chain is a chain of one (`fallback.targets_here`). A chained one
(ADR-0022) waits in the pool of each target its chain has reached here; in each it takes its turn
in the same order, and it takes the first of its targets, in chain order, that has room on a
machine nothing ahead of it in that target's pool holds. A replica a `replicas` step made
optional holds nothing and takes only room no other waiting workload could use.

The pass decides a queue's groups (`queue.py`), not its members one by one: a group's members
may use the same machines and share a quota, so when its oldest waits, all of them do. A pass
costs the number of groups, not the depth of the queue.
"""

from __future__ import annotations

import heapq
from itertools import count

from einsora.common.schemas import Placement, Target, WorkloadState
from einsora.scheduler import drivers, fallback, order, reasons, score, why
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand, Grant, free_cpus, free_memory_mib
from einsora.scheduler.filters import quota, trust, usable
from einsora.scheduler.model import Liveness, Machine, Row, Workload
from einsora.scheduler.queue import Group


def admit(book: Book, workload: Workload, demand: Demand) -> None:
    """Place a pending workload now if its turn has come and something fits, else queue it."""
    book.enqueue(workload, demand.pool)
    admit_pool(book, demand.pool)
    if workload.state is WorkloadState.pending:
        book.transition(workload, WorkloadState.queued, why.queued(book, workload, demand))


def admit_queued(book: Book) -> None:
    """Capacity freed somewhere (or a waiting workload left): admit what now may go."""
    for pool in list(book.queue):
        admit_pool(book, pool)


def admit_pool(book: Book, pool: str) -> None:
    """One pass over the pool's queue, in its order."""
    queue = book.queue.get(pool)
    if not queue:
        return
    if len(queue.groups) == 1:  # one kind of workload waits (a launch, most often): no order
        [group] = queue.groups.values()
        while group.members and _try(book, group.head, pool, set(), group)[0]:
            pass
        if not queue:
            book.queue.pop(pool, None)
        return
    by_use = order.fair(book, pool)
    tie = count()
    heap = [(order.group_rank(book, g, by_use), next(tie), g) for g in queue.groups.values()]
    heapq.heapify(heap)
    held: set[str] = set()
    while heap:
        _, _, group = heapq.heappop(heap)
        workload = group.head
        placed, holds = _try(book, workload, pool, held, group)
        if not placed:
            held |= holds
            continue  # its group waits behind it: the same machines, the same quota
        if group.members and queue.group_of(group.head) is group:
            heapq.heappush(heap, (order.group_rank(book, group, by_use), next(tie), group))
    if not queue:
        book.queue.pop(pool, None)


def _try(
    book: Book, workload: Workload, pool: str, held: set[str], group: Group
) -> tuple[bool, frozenset[str]]:
    """Place the workload at the first of its targets here that has room on a machine not
    held; else what it holds in `pool` while it waits."""
    optional = workload.chain is not None and workload.chain.optional
    holds: frozenset[str] = frozenset()
    said = None
    for target in fallback.targets_here(book, workload):
        demand = fallback.demand_for(book, workload, target)
        if demand is None:
            continue
        over = quota.refusal(book, workload, demand)
        if over is not None:
            said = said or over
            continue
        wants = usable.machines(book, workload, demand, target.machine)
        if demand.pool == pool:
            blocked: frozenset[str] | set[str] = held
            if not optional:
                holds |= wants
        else:
            blocked = order.held_ahead(book, workload, demand.pool)
        if optional:
            blocked = set(blocked) | order.wanted_by_others(book, workload, demand.pool)
        grant = score.choose(book, workload, demand, wants, blocked) if wants else None
        if grant is not None:
            book.take(workload)
            place(book, workload, demand, grant, target.index if workload.chain else None)
            group.said, group.holds = None, frozenset()
            return True, frozenset()
    if workload.chain is None and not holds:
        # Its quota, or no machine that would ever hold it, keeps it waiting: it holds nothing,
        # and its group's timelines say why when that changes.
        demand = fallback.demand_for(book, workload, fallback.targets_here(book, workload)[0])
        if demand is not None:
            _tell(book, group, said or why.queued(book, workload, demand))
    else:
        group.said = None
    group.holds = holds
    return False, holds


def _tell(book: Book, group: Group, reason: str) -> None:
    """Each queued member of the group is told `reason`, once, when it changes."""
    if group.said == reason:
        return
    group.said = reason
    for member in group.members:
        if member.state is WorkloadState.queued and member.reason != reason:
            member.reason = reason
            book.note(member, reason)


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
    choice = trust.driver_for(book, machine, workload)
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
