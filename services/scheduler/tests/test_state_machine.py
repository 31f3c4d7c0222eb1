"""The scheduler's side of the one state machine: every (state, action) pair of the lifecycle
table, applied to a workload brought to that state the way the scheduler brings it there.

An action the table allows is applied (a transition the table allows too); any other changes
nothing and leaves a note in the same words as the api's 409. The api's side of the same pairs
is services/api/tests/test_state_machine.py.
"""

from __future__ import annotations

import logging
from itertools import pairwise

import pytest

from einsora.common import lifecycle
from einsora.common.catalog import Catalog
from einsora.common.ids import new_id
from einsora.common.schemas import (
    EventKind,
    Gpu,
    IntentAction,
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.scheduler.book import Book
from einsora.scheduler.intents import apply_intent
from einsora.scheduler.model import Machine, Workload
from einsora.scheduler.observe import apply_observed
from einsora.scheduler.reclaim import check_reclaim

CATALOG = Catalog.load()
MACHINE = "m-1"


def _book() -> Book:
    inventory = Inventory(
        machine_id=MACHINE,
        region="local",
        hostname=MACHINE,
        os="linux",
        arch="x86_64",
        cpus=16,
        memory_mib=64 * 1024,
        gpus=[Gpu(index=0, uuid="GPU-0", model="NVIDIA L40S", memory_mib=46068)],
        drivers=["sim"],
    )
    book = Book("local", CATALOG, sim_machines=True)
    machine = Machine(MACHINE, "local", inventory, generation=1, owner_tenant="t-1")
    book.add_machine(machine, new=False)
    return book


def _intent(action: IntentAction, workload_id: str) -> WorkloadIntent:
    return WorkloadIntent.model_validate(
        {
            "intent_id": new_id("intent"),
            "action": action,
            "workload_id": workload_id,
            "tenant_id": "t-1",
            "region": "local",
            "kind": WorkloadKind.notebook,
            "class": "l40s-48gb",
        }
    )


def _report(book: Book, workload_id: str, phase: ObservedPhase | None) -> None:
    """The agent's report of the machine, with the workload in `phase` (None: not there)."""
    machine = book.machines[MACHINE]
    seen = [] if phase is None else [ObservedWorkload(workload_id=workload_id, phase=phase)]
    apply_observed(
        book,
        ObservedState(machine_id=MACHINE, generation_applied=machine.generation, workloads=seen),
        seen_at=1.0,
    )


class _Preempt:
    """The step that preempts the workload (no intent, no report: the scheduler's own tick)."""


def _preempt(book: Book) -> None:
    """The machine is no longer its tenant's to use (another owns it now, with no grace): its
    workload is preempted as a guest's would be (ADR-0017)."""
    machine = book.machines[MACHINE]
    machine.owner_tenant, machine.reclaim_grace_s, machine.guest_min_runtime_s = "t-2", 0, 0
    machine.enrolled = True
    book.machine_changed(machine)
    check_reclaim(book)


def _in_state(state: WorkloadState) -> tuple[Book, Workload]:
    """A book with one workload brought to `state` by intents and the agent's reports."""
    book = _book()
    if state is WorkloadState.queued:
        # The only GPU is taken, so the second l40s workload waits.
        apply_intent(book, _intent(IntentAction.create, new_id("workload")), None)
    workload_id = new_id("workload")
    if state is WorkloadState.pending:
        # Pending lasts only until placement is tried; a book loaded from the store may hold one.
        workload = Workload(
            workload_id=workload_id,
            tenant_id="t-1",
            region="local",
            kind=WorkloadKind.notebook,
            class_name="l40s-48gb",
            count=1,
            spec={},
            state=WorkloadState.pending,
            access_token="token",
            created_at=utcnow(),
            pending_since=utcnow(),
        )
        book.add_workload(workload)
        return book, workload
    apply_intent(book, _intent(IntentAction.create, workload_id), None)
    workload = book.workloads[workload_id]
    steps: dict[WorkloadState, list[IntentAction | ObservedPhase | _Preempt | None]] = {
        WorkloadState.queued: [],
        WorkloadState.scheduled: [],
        WorkloadState.starting: [ObservedPhase.starting],
        WorkloadState.running: [ObservedPhase.running],
        WorkloadState.parking: [ObservedPhase.running, IntentAction.park],
        WorkloadState.parked: [ObservedPhase.running, IntentAction.park, ObservedPhase.parked],
        WorkloadState.failed: [ObservedPhase.running, ObservedPhase.failed],
        WorkloadState.removing: [ObservedPhase.running, IntentAction.remove],
        WorkloadState.removed: [ObservedPhase.running, IntentAction.remove, None],
        WorkloadState.preempted: [ObservedPhase.running, _Preempt()],
    }
    for step in steps[state]:
        if isinstance(step, IntentAction):
            apply_intent(book, _intent(step, workload_id), None)
        elif isinstance(step, _Preempt):
            _preempt(book)
        else:
            _report(book, workload_id, step)
    assert workload.state is state
    return book, workload


@pytest.mark.parametrize("action", list(lifecycle.ACTIONS))
@pytest.mark.parametrize("state", list(WorkloadState))
def test_the_scheduler_applies_what_the_table_allows(
    state: WorkloadState, action: IntentAction, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="einsora.scheduler.book")
    book, workload = _in_state(state)
    changes = book.begin()
    apply_intent(book, _intent(action, workload.workload_id), None)
    events = [e.event for e in changes.events if e.event.workload_id == workload.workload_id]
    assert events, "an intent always leaves a transition or a note"
    if lifecycle.allows(action, state):
        transitions = [e for e in events if e.kind is EventKind.transition]
        assert transitions, f"{action.value} from {state.value} was not applied"
        path = [state, *(e.state for e in transitions)]
        for before, after in pairwise(path):
            assert lifecycle.may_follow(before, after), f"{before.value} → {after.value}"
    else:
        why = lifecycle.refusal(action, state)
        assert [(e.kind, e.state, e.reason) for e in events] == [
            (EventKind.note, state, f"{why}; nothing changed")
        ]
        assert workload.state is state
    assert not caplog.records, "a move off the lifecycle table"


def test_a_move_off_the_table_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="einsora.scheduler.book")
    book, workload = _in_state(WorkloadState.removed)
    book.transition(workload, WorkloadState.running, "a decision with a bug")
    [record] = caplog.records
    assert record.getMessage() == "a transition the lifecycle table does not allow"
    assert (record.__dict__["from"], record.__dict__["to"]) == ("removed", "running")
