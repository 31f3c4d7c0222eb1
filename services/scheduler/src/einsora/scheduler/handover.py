"""Region steps: handing a workload over to the next region's scheduler, exactly once
(ADR-0022).

A workload belongs to one region's scheduler at a time: the one whose region its row names.
A region step moves it in one cycle of the first region: the workload leaves every queue here,
what it held here is released (a working directory left on a machine here is deleted), its row
now names the next region, its last event here is a note that says so (`WorkloadEvent.region`
tells the api where its later intents go), and a `Handoff` with a create intent carrying a
`Handover` is stored with the same commit. The projection publishes it to the next region's
subject once the events are out, with `Nats-Msg-Id` = its intent id, derived from the workload
and the note's `seq`: every replay of the hop (a restart before the publish, a republish after
it) sends the same intent, which JetStream drops as a duplicate within its window and the next
scheduler applies once (its processed intents). Nothing here ever writes the workload again.

An intent that reaches a region after the workload left it (the api had not yet heard of the
hop) is passed on the same way to the region the workload went to (`forward`).
"""

from __future__ import annotations

import logging

from einsora.common.ids import derived_id
from einsora.common.schemas import (
    MAX_STEPS,
    Handover,
    IntentAction,
    Target,
    WorkloadIntent,
    utcnow,
)
from einsora.scheduler.book import Book, Handoff
from einsora.scheduler.fallback import Target as Step
from einsora.scheduler.fallback import chain_of
from einsora.scheduler.model import Workload

log = logging.getLogger("einsora.scheduler.handover")

MAX_FORWARDS = 8
"""An intent passed on more often than this is dropped (and logged): the regions disagree on
where the workload is, which only a bug can cause."""


def hop(book: Book, workload: Workload, step: Step, note: str, explained: list[str]) -> None:
    """Hand the workload over to `step`'s region, whose scheduler starts at `step`."""
    chain = workload.chain
    assert chain is not None
    book.dequeue(workload)
    placed = book.row_of(workload)
    if placed is not None:
        machine, row = placed
        book.release(machine, row, Target.removed)  # its working directory here goes
    since = chain.since or book.clock()
    explained = explained[-(MAX_STEPS + 1) :]  # one clause per target at most
    workload.machine_id = None
    workload.region = step.region
    chain.start, chain.reached, chain.since = step.index, step.index - 1, since
    chain.explained = explained
    book.note(workload, note)  # its last event here; the next region's follow its seq
    handover = Handover(
        from_region=book.region,
        asked_region=chain.asked_region or book.region,
        step=step.index,
        seq=workload.seq,
        since=since,
        reached=step.index - 1,
        explained=explained,
        state=workload.state,
    )
    intent = WorkloadIntent.model_validate(
        {
            "intent_id": derived_id("intent", workload.workload_id, "handover", str(workload.seq)),
            "action": IntentAction.create,
            "workload_id": workload.workload_id,
            "tenant_id": workload.tenant_id,
            "user_id": workload.user_id,
            "region": step.region,
            "kind": workload.kind,
            "name": workload.name,
            "class": workload.class_name,
            "count": workload.count,
            "spec": workload.spec,
            "fallback": chain.steps,
            "fallback_after_s": chain.after_s,
            "replica": chain.replica,
            "handover": handover,
            "at": workload.pending_since or since,
        }
    )
    book.changes.handoffs.append(Handoff(intent, _request_id(book, workload.request_id)))
    log.info(
        "workload handed over to the next region",
        extra={"workload_id": workload.workload_id, "to": step.region, "step": step.index},
    )


def accept(
    book: Book, intent: WorkloadIntent, request_id: str | None, *, stored: bool
) -> Workload | None:
    """A workload handed over to this region; None when it is ours already (a store shared
    with the region before had it loaded here at start: the chain's timer walks it on).
    `stored`: the store has its row (shared with the region before, or it was here before),
    so it is updated rather than inserted."""
    handover = intent.handover
    assert handover is not None
    known = book.workloads.get(intent.workload_id)
    if known is not None and known.region == book.region:
        return None
    chain = chain_of(intent, handover.asked_region)
    if chain is None:
        log.warning("a hand-over without a fallback chain is ignored")
        return None
    chain.start, chain.reached, chain.since = handover.step, handover.reached, handover.since
    chain.explained = list(handover.explained)
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
        state=handover.state,
        access_token=book.access_token_for(intent.workload_id),
        created_at=utcnow(),
        seq=handover.seq,
        pending_since=intent.at,
        request_id=request_id,
        chain=chain,
    )
    if stored or known is not None:
        book.workloads[workload.workload_id] = workload
        book.save_workload(workload)
    else:
        book.add_workload(workload)
    return workload


def forward(book: Book, intent: WorkloadIntent, request_id: str | None, region: str) -> None:
    """Pass on an intent about a workload that is now `region`'s (recorded as processed here
    by the caller)."""
    if intent.forwarded >= MAX_FORWARDS:
        log.error(
            "an intent passed on too often is dropped",
            extra={"intent_id": intent.intent_id, "workload_id": intent.workload_id},
        )
        return
    passed = intent.model_copy(
        update={
            "intent_id": derived_id("intent", intent.intent_id, region),
            "region": region,
            "forwarded": intent.forwarded + 1,
        }
    )
    book.changes.handoffs.append(Handoff(passed, _request_id(book, request_id)))
    log.info(
        "intent passed on to the region that holds the workload",
        extra={"workload_id": intent.workload_id, "action": intent.action.value, "to": region},
    )


def _request_id(book: Book, request_id: str | None) -> str:
    return request_id or f"scheduler-{book.region}"
