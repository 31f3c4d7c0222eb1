"""Owner reclaim: guests' workloads leave a machine its owner takes back (ADR-0017).

A guest's workload (any tenant but the machine's owner's) is preempted when its machine is
reclaimed (through the api, or by its agent while the control plane was away) or no longer
shared with its tenant (made private, the invitation revoked). Not at once: only once the
machine's grace has passed, counted from the reclaim (or from when this scheduler first saw
the workload no longer allowed), and once the workload has run its minimum runtime, so a
guest is never stopped moments after starting. A workload not yet running has nothing to lose
and goes at the grace. Its timeline is told when it will go, once per deadline.

Preempting releases its devices with target `parked` (the agent stops it and keeps its
working directory: a notebook keeps its disk), drops its route and moves it to `preempted`,
which closes its allocation. The owner's own workloads are never touched. Called on every tick;
judged by the book's wall clock (`Book.clock`), which a test replaces.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from einsora.common.schemas import Target, WorkloadState
from einsora.scheduler import reasons
from einsora.scheduler.book import Book
from einsora.scheduler.model import Machine, Row, Workload
from einsora.scheduler.trust import Trust, trust_level

_ON_A_MACHINE = frozenset({WorkloadState.scheduled, WorkloadState.starting, WorkloadState.running})


def check_reclaim(book: Book) -> None:
    """Preempt every guest's workload whose time has come; tell the others when it will."""
    now = book.clock()
    affected: set[str] = set()
    for machine in book.machines.values():
        if machine.revoked or not machine.enrolled:
            continue  # a book just rebuilt knows its machines' owners only once re-read
        for row, workload in book.rows_on(machine):
            if (
                workload is None
                or workload.machine_id != machine.machine_id
                or workload.state not in _ON_A_MACHINE
            ):
                continue
            level = trust_level(machine, workload.tenant_id, book.owner_tenant, book.community_pool)
            if level is Trust.owner:
                continue
            if level is None:
                since = book.unshared_since.setdefault(workload.workload_id, now)
                reclaimed = False
            elif machine.reclaimed_at is not None:
                since, reclaimed = machine.reclaimed_at, True
            else:
                continue
            affected.add(workload.workload_id)
            _judge(book, machine, row, workload, since, reclaimed, now)
    # A workload allowed again (released, invited again) starts afresh if it is ever not.
    for gone in set(book.unshared_since) - affected:
        del book.unshared_since[gone]
    for gone in set(book.preempt_notes) - affected:
        del book.preempt_notes[gone]


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
    reclaimed: bool,
    now: datetime,
) -> None:
    at = preempt_at(machine, workload, since)
    if now >= at:
        book.preempt_notes.pop(workload.workload_id, None)
        book.unshared_since.pop(workload.workload_id, None)
        book.release(machine, row, Target.parked)
        book.drop_route(workload)
        book.transition(
            workload, WorkloadState.preempted, reasons.preempted(machine.machine_id, reclaimed)
        )
        return
    if book.preempt_notes.get(workload.workload_id) != at:
        book.preempt_notes[workload.workload_id] = at
        book.note(workload, reasons.preempting(machine.machine_id, reclaimed, f"{at:%H:%M:%S}"))
