"""Owner reclaim and narrowing: guests' workloads leave a machine its owner takes back
(ADR-0017).

A guest's workload (any tenant but the machine's owner's) is preempted when its machine is
reclaimed (through the api, or by its agent while the control plane was away), no longer
shared with its tenant (made private, the invitation revoked), or no longer lent whole enough
to hold it: its owner narrowed the lend, so the workload holds a GPU no longer lent, or the
workloads there hold more cores or memory than are lent (then guests go newest first until the
rest fit; the owner's own stay, and new placements wait until there is room). Not at once:
only once the machine's grace has passed, counted from the reclaim (or from when this
scheduler first saw the workload had to go), and once the workload has run its minimum
runtime, so a guest is never stopped moments after starting. A workload not yet running has
nothing to lose and goes at the grace. Its timeline is told when it will go, once per
deadline; allowed again before then (released, shared again, lent again), it stays.

Preempting releases its devices with target `parked` (the agent stops it and keeps its
working directory: a notebook keeps its disk), drops its route and moves it to `preempted`,
which closes its allocation. The owner's own workloads are never touched. Called on every tick;
judged by the book's wall clock (`Book.clock`), which a test replaces.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from einsora.common.schemas import Target, WorkloadState
from einsora.scheduler import chain, reasons
from einsora.scheduler.book import Book
from einsora.scheduler.model import Machine, Preemption, Row, Workload
from einsora.scheduler.trust import Trust, trust_level

_ON_A_MACHINE = frozenset({WorkloadState.scheduled, WorkloadState.starting, WorkloadState.running})


def check_reclaim(book: Book) -> None:
    """Preempt every guest's workload whose time has come; tell the others when it will."""
    now = book.clock()
    affected: set[str] = set()
    for machine in book.machines.values():
        if machine.revoked or not machine.enrolled:
            continue  # a book just rebuilt knows its machines' owners only once re-read
        unlent = unlent_guests(book, machine)
        for row, workload in _guests_on(book, machine):
            level = _trust(book, machine, workload)
            if level is None:
                why = Preemption.unshared
            elif machine.reclaimed_at is not None:
                why = Preemption.reclaimed
            elif workload.workload_id in unlent:
                why = Preemption.unlent
            else:
                continue
            if why is Preemption.reclaimed:
                assert machine.reclaimed_at is not None
                since = machine.reclaimed_at
            else:
                since = book.notice_since.setdefault(workload.workload_id, now)
            affected.add(workload.workload_id)
            _judge(book, machine, row, workload, since, why, now)
    # A workload allowed again (released, invited again, lent again) starts afresh if it is
    # ever not.
    for gone in set(book.notice_since) - affected:
        del book.notice_since[gone]
    for gone in set(book.preempt_notes) - affected:
        why, _ = book.preempt_notes.pop(gone)
        staying = book.workloads.get(gone)
        if why is Preemption.unlent and staying is not None and staying.state in _ON_A_MACHINE:
            book.note(staying, reasons.lent_again(staying.machine_id or "its machine"))


def _guests_on(book: Book, machine: Machine) -> list[tuple[Row, Workload]]:
    """The workloads on `machine` (placed there, not leaving) of any tenant but its owner's."""
    found = []
    for row, workload in book.rows_on(machine):
        if (
            workload is None
            or workload.machine_id != machine.machine_id
            or workload.state not in _ON_A_MACHINE
        ):
            continue
        level = _trust(book, machine, workload)
        if level is not Trust.owner:
            found.append((row, workload))
    return found


def unlent_guests(book: Book, machine: Machine) -> set[str]:
    """The guests' workloads that no longer fit what the owner lends of `machine`: each that
    holds a GPU no longer lent, then, while the workloads there hold more cores or memory than
    are lent, the newest of those holding what is short (the owner's own never go)."""
    if machine.lend is None:
        return set()
    out: set[str] = set()
    rest: list[tuple[Row, Workload]] = []
    for row, workload in _guests_on(book, machine):
        if any(not machine.lends_gpu(uuid) for uuid in row.gpus):
            out.add(workload.workload_id)
        else:
            rest.append((row, workload))
    held = [row for row in machine.rows.values() if row.workload_id not in out]
    cpus = sum(row.cpus for row in held)
    memory_mib = sum(row.memory_mib for row in held)
    for row, workload in sorted(rest, key=_newest_first):
        over_cpus = cpus > machine.lent_cpus
        over_memory = memory_mib > machine.lent_memory_mib
        if not (over_cpus or over_memory):
            break
        if (over_cpus and row.cpus > 0) or (over_memory and row.memory_mib > 0):
            out.add(workload.workload_id)
            cpus -= row.cpus
            memory_mib -= row.memory_mib
    return out


def _newest_first(placed: tuple[Row, Workload]) -> tuple[bool, float, str]:
    """Not yet running first (it has lost nothing), then the latest to start running."""
    _, workload = placed
    started = workload.running_since or workload.created_at
    return (workload.state is WorkloadState.running, -started.timestamp(), workload.workload_id)


def preempt_at(machine: Machine, workload: Workload, since: datetime) -> datetime:
    """When a guest's workload goes: its grace passed and, when running, its minimum runtime."""
    at = since + timedelta(seconds=machine.reclaim_grace_s)
    if workload.state is WorkloadState.running and workload.running_since is not None:
        at = max(at, workload.running_since + timedelta(seconds=machine.guest_min_runtime_s))
    return at


def _judge(
    book: Book,
    machine: Machine,
    row: Row,
    workload: Workload,
    since: datetime,
    why: Preemption,
    now: datetime,
) -> None:
    at = preempt_at(machine, workload, since)
    if now >= at:
        book.preempt_notes.pop(workload.workload_id, None)
        book.notice_since.pop(workload.workload_id, None)
        book.release(machine, row, Target.parked)
        book.drop_route(workload)
        book.transition(
            workload, WorkloadState.preempted, reasons.preempted(machine.machine_id, why)
        )
        # Opted in to fallback: it is placed again by its chain (ADR-0022).
        chain.after_eviction(book, workload, f"preempted from {machine.machine_id}")
        return
    if book.preempt_notes.get(workload.workload_id) != (why, at):
        book.preempt_notes[workload.workload_id] = (why, at)
        book.note(workload, reasons.preempting(machine.machine_id, why, f"{at:%H:%M:%S}"))


def _trust(book: Book, machine: Machine, workload: Workload) -> Trust | None:
    return trust_level(
        machine, workload.tenant_id, book.owner_tenant, book.community_pool, workload.user_id
    )
