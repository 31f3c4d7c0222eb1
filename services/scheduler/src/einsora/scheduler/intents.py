"""What each intent does: create, park, resume, remove.

Each function is a decision over the book; the engine has already dropped intents it has seen
(by `intent_id`), so these run once per intent. Whether an action applies in the workload's
state is `einsora.common.lifecycle`'s table, the one the api accepted it by; the workload may
have moved on since (it failed, or a remove came first), and then the intent changes nothing
and leaves a note saying why, rather than failing.

A workload with a fallback chain is admitted by walking it (`chain.py`); a create that a region
step handed over here carries on where the region before stopped, and an intent about a
workload this region handed over is passed on to where it went (`handover.py`, ADR-0022).
"""

from __future__ import annotations

import logging

from einsora.common import lifecycle
from einsora.common.schemas import (
    IntentAction,
    Target,
    WorkloadIntent,
    WorkloadState,
    utcnow,
)
from einsora.scheduler import chain, handover, reasons
from einsora.scheduler.book import Book, ProcessedIntent
from einsora.scheduler.capacity import demand_of
from einsora.scheduler.fallback import chain_of
from einsora.scheduler.model import Liveness, Workload

log = logging.getLogger("einsora.scheduler.intents")

_ON_A_MACHINE = frozenset({WorkloadState.scheduled, WorkloadState.starting, WorkloadState.running})


def apply_intent(
    book: Book,
    intent: WorkloadIntent,
    request_id: str | None,
    *,
    stored_region: str | None = None,
) -> None:
    """Apply one new intent and record it as processed. `stored_region`: the region the store
    gives a workload the book does not hold (a hand-over, or one that left this region).

    A park, resume or remove of a workload neither the book nor the store knows came before
    its create (the create's delivery failed and is on its way again): it is not processed but
    put `ahead`, so the bus delivers it again after the create. Ignoring it would lose an
    acknowledged request (I3). A park, resume or remove delivered after a later one of the same
    workload was applied (its first delivery held by a scheduler that stopped) is not applied:
    the later one was its owner's last word. Ordered by when the api took each (`at`): the api
    takes one workload's requests one at a time."""
    unknown = book.workloads.get(intent.workload_id) is None and stored_region is None
    if unknown and intent.action is not IntentAction.create and intent.handover is None:
        book.changes.ahead.add(intent.intent_id)
        log.info(
            "intent before its workload's create: delivered again later",
            extra={"workload_id": intent.workload_id, "action": intent.action.value},
        )
        return
    book.changes.intents.append(
        ProcessedIntent(intent.intent_id, intent.workload_id, intent.action.value)
    )
    if intent.handover is not None:
        stored = stored_region is not None
        taken = handover.accept(book, intent, request_id, stored=stored)
        if taken is not None:
            chain.admit(book, taken)
        return
    workload = book.workloads.get(intent.workload_id)
    holder = workload.region if workload is not None else stored_region
    if holder is not None and holder != book.region:
        handover.forward(book, intent, request_id, holder)
        return
    if intent.action is IntentAction.create:
        if workload is not None:
            log.warning(
                "a second create for a known workload is ignored",
                extra={"workload_id": intent.workload_id, "intent_id": intent.intent_id},
            )
            return
        _create(book, intent, request_id)
        return
    if workload is None:
        log.warning(
            "intent for a workload this scheduler does not know is ignored",
            extra={"workload_id": intent.workload_id, "action": intent.action.value},
        )
        return
    workload.request_id = request_id or workload.request_id
    last = workload.last_asked
    if last is not None and intent.at < last[0]:
        # Its first delivery was held by a scheduler that stopped, and a later request of the
        # same workload came first: applying it now would undo its owner's last word (I3).
        book.note(workload, reasons.overtaken(intent.action.value, last[1]))
        return
    workload.last_asked = (intent.at, intent.action.value)
    why_not = lifecycle.refusal(intent.action, workload.state)
    if why_not is not None:
        book.note(workload, reasons.not_applied(why_not))
        return
    if intent.action is IntentAction.park:
        _park(book, workload)
    elif intent.action is IntentAction.resume:
        _resume(book, workload, intent)
    else:
        _remove(book, workload)


def _create(book: Book, intent: WorkloadIntent, request_id: str | None) -> None:
    workload = Workload(
        workload_id=intent.workload_id,
        tenant_id=intent.tenant_id,
        user_id=intent.user_id,
        region=book.region,
        kind=intent.kind,
        name=intent.name,
        class_name=intent.class_name,
        count=intent.count,
        spec=dict(intent.spec),
        state=WorkloadState.pending,
        access_token=book.access_token_for(intent.workload_id),
        created_at=utcnow(),
        pending_since=intent.at,
        request_id=request_id,
        chain=chain_of(intent, book.region),
    )
    book.add_workload(workload)
    demand = demand_of(book.catalog, workload)
    if demand is None:
        book.transition(workload, WorkloadState.failed, reasons.unknown_class(intent.class_name))
        return
    chain.admit(book, workload, demand)


def _park(book: Book, workload: Workload) -> None:
    state = workload.state
    if state in (WorkloadState.pending, WorkloadState.queued):
        book.dequeue(workload)
        home = book.row_of(workload)
        book.transition(
            workload, WorkloadState.parked, reasons.parked(home[0].machine_id if home else None)
        )
        return
    placed = book.row_of(workload)
    if state in _ON_A_MACHINE and placed is not None:
        machine, row = placed
        row.target = Target.parked  # devices stay booked until the agent says it stopped
        book.set_row(machine, row)
        book.drop_route(workload)
        book.transition(workload, WorkloadState.parking, reasons.parking(machine.machine_id))
        return
    # Allowed by the table, yet it holds no place on a machine: there is nothing to release.
    book.note(workload, reasons.nothing_to_park(state.value))


def _resume(book: Book, workload: Workload, intent: WorkloadIntent) -> None:
    demand = demand_of(book.catalog, workload)
    if demand is None:
        book.transition(workload, WorkloadState.failed, reasons.unknown_class(workload.class_name))
        return
    workload.state = WorkloadState.pending
    workload.pending_since = intent.at
    chain.restart(workload)  # a resume walks its whole chain again
    chain.admit(book, workload, demand)


def _remove(book: Book, workload: Workload) -> None:
    book.dequeue(workload)
    placed = book.row_of(workload)
    if placed is None:
        book.transition(workload, WorkloadState.removed, reasons.removed(None))
        return
    machine, row = placed
    book.drop_route(workload)
    row.target = Target.removed  # devices stay booked until the agent says it stopped
    book.set_row(machine, row)
    if machine.liveness is Liveness.lost:
        book.release(machine, row, Target.removed)
        book.transition(
            workload, WorkloadState.removed, reasons.removed_while_lost(machine.machine_id)
        )
        return
    book.transition(workload, WorkloadState.removing, reasons.removing(machine.machine_id))
