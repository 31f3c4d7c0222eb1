"""The workload state machine: which state may follow which, and what a user may ask in each.

One table (ADR-0010), read by the api to accept or refuse a park, resume or remove (a 409 that
names the state and what is allowed from it), and by the scheduler to apply an accepted action
or, when the workload has moved on since the api accepted it, to leave a note saying why not.
The api records only the state the user's request implies (`ActionRule.requested`); every
transition after that is the scheduler's. Nothing else may spell these rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from einsora.common.schemas.workload import IntentAction
from einsora.common.vocab import WorkloadState

_S = WorkloadState

TRANSITIONS: Mapping[WorkloadState, frozenset[WorkloadState]] = {
    _S.pending: frozenset({_S.queued, _S.scheduled, _S.parked, _S.removing, _S.removed, _S.failed}),
    _S.queued: frozenset({_S.scheduled, _S.parked, _S.removing, _S.removed, _S.failed}),
    _S.scheduled: frozenset(
        {_S.starting, _S.running, _S.parking, _S.removing, _S.removed, _S.failed, _S.preempted}
    ),
    _S.starting: frozenset(
        {_S.running, _S.parking, _S.removing, _S.removed, _S.failed, _S.preempted}
    ),
    _S.running: frozenset({_S.parking, _S.removing, _S.removed, _S.failed, _S.preempted}),
    _S.parking: frozenset({_S.parked, _S.removing, _S.removed, _S.failed}),
    _S.parked: frozenset({_S.pending, _S.queued, _S.scheduled, _S.removing, _S.removed, _S.failed}),
    _S.removing: frozenset({_S.removed, _S.failed}),
    _S.removed: frozenset(),
    _S.failed: frozenset({_S.pending, _S.queued, _S.scheduled, _S.removing, _S.removed, _S.failed}),
    _S.preempted: frozenset(
        {_S.pending, _S.queued, _S.scheduled, _S.removing, _S.removed, _S.failed}
    ),
}
"""The states the scheduler may move a workload to from each state.

A resumed workload is pending only for the moment its placement is tried, so from parked or
failed it may go straight on to queued or scheduled. A remove ends in removed at once when
nothing runs anywhere (or the machine is lost), and in failed when the machine stopped the
workload but could not clean up. A failed workload fails again when a resume finds its class
gone from the catalog. A guest's workload is preempted when its machine's owner takes the
machine back (ADR-0017); like a failed one, it may be resumed (placed again) or removed.
"""


@dataclass(frozen=True)
class ActionRule:
    """One user action: where it is allowed, what the api records, and what it is called."""

    action: IntentAction
    verb: str
    """The action in a sentence: "cannot park a workload that is ..."."""
    done: str
    """Its participle: "a pending workload can only be parked or removed"."""
    allowed_from: frozenset[WorkloadState]
    requested: WorkloadState
    """The state the api records when it accepts the action; the scheduler goes on from it."""


ACTIONS: Mapping[IntentAction, ActionRule] = {
    IntentAction.park: ActionRule(
        IntentAction.park,
        "park",
        "parked",
        frozenset({_S.pending, _S.queued, _S.scheduled, _S.starting, _S.running}),
        _S.parking,
    ),
    IntentAction.resume: ActionRule(
        # From failed too: resuming is how a user retries a workload that failed; from
        # preempted: how a guest runs it again elsewhere (ADR-0017).
        IntentAction.resume,
        "resume",
        "resumed",
        frozenset({_S.parked, _S.failed, _S.preempted}),
        _S.pending,
    ),
    IntentAction.remove: ActionRule(
        IntentAction.remove,
        "remove",
        "removed",
        frozenset(WorkloadState) - {_S.removing, _S.removed},
        _S.removing,
    ),
}
"""The user's actions (a launch is no action on a workload: it makes one)."""


def allowed_actions(state: WorkloadState) -> list[IntentAction]:
    """The actions a user may ask of a workload in `state`, in the table's order."""
    return [rule.action for rule in ACTIONS.values() if state in rule.allowed_from]


def allows(action: IntentAction, state: WorkloadState) -> bool:
    """Whether `action` may be asked of a workload in `state`."""
    rule = ACTIONS.get(action)
    return rule is not None and state in rule.allowed_from


def refusal(action: IntentAction, state: WorkloadState) -> str | None:
    """None when `action` is allowed from `state`; else why not, and what is allowed instead.

    The api's 409 and the scheduler's note for an intent it cannot apply say the same words.
    """
    if allows(action, state):
        return None
    rule = ACTIONS.get(action)
    verb = rule.verb if rule is not None else action.value
    others = [ACTIONS[a].done for a in allowed_actions(state)]
    if not others:
        instead = f"a {state.value} workload can no longer be changed"
    else:
        choices = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} or {others[-1]}"
        instead = f"a {state.value} workload can only be {choices}"
    return f"cannot {verb} a workload that is {state.value}: {instead}"


def may_follow(current: WorkloadState, new: WorkloadState) -> bool:
    """Whether the scheduler may move a workload from `current` to `new`."""
    return new in TRANSITIONS[current]
