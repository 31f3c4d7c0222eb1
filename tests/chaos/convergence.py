"""I3: every acknowledged request converged, and none was lost.

For each workload something was asked of and acknowledged (201 or 202), its last transition on
the bus (the scheduler's own order) is where that request may end: its target, or failed (or
preempted) with a reason; a request after it that got no answer, or a server error, may have
been carried out all the same, so its ends count too. What the events say, the api's view and
the machines' last desired values say too: running on the machine the events name, and desired
running there alone; anything else desired running nowhere. A retried Idempotency-Key made one
workload. Each violation carries the workload's history: what was asked, its transitions, and
its desired rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tests.chaos.checks import Violation
from tests.chaos.model import Action, DesiredValue, Event, Record, Request, clock

OUTCOMES: dict[Action, frozenset[str]] = {
    Action.create: frozenset({"running", "failed", "preempted"}),
    Action.resume: frozenset({"running", "failed", "preempted"}),
    Action.park: frozenset({"parked", "failed"}),
    Action.remove: frozenset({"removed", "failed"}),
}
"""Where a workload may end after each action: its target, or failed (or preempted) with a
reason. A scheduler that finds an action no longer applies leaves a note, and the workload
where it was: failed (a lost machine), for instance."""


def last_transitions(events: Iterable[Event]) -> dict[str, Event]:
    """Each workload's last transition, by the scheduler's own order (`seq`)."""
    last: dict[str, Event] = {}
    for e in events:
        if e.transition and (e.workload not in last or e.seq > last[e.workload].seq):
            last[e.workload] = e
    return last


def placements(events: Iterable[Event]) -> dict[str, str | None]:
    """Each workload's machine as its last event that names one says."""
    where: dict[str, tuple[int, str]] = {}
    for e in events:
        if e.machine is not None and (e.workload not in where or e.seq > where[e.workload][0]):
            where[e.workload] = (e.seq, e.machine)
    return {w: m for w, (_, m) in where.items()}


def final_desired(values: Sequence[DesiredValue]) -> dict[str, DesiredValue]:
    """Each machine's last desired value."""
    last: dict[str, DesiredValue] = {}
    for value in sorted(values, key=lambda v: v.seq):
        if value.deleted:
            last.pop(value.machine, None)
        else:
            last[value.machine] = value
    return last


@dataclass(frozen=True)
class Asked:
    """What was last asked of a workload and acknowledged, and where it may so end."""

    final: Request
    expected: frozenset[str]


def asked(requests: Iterable[Request]) -> dict[str, Asked]:
    """Each workload with an acknowledged request: its last one, and the states it may end in
    (a request after it left unanswered, or answered with a server error, may have been
    carried out all the same)."""
    by_workload: defaultdict[str, list[Request]] = defaultdict(list)
    for r in sorted(requests, key=lambda r: r.sent):
        if r.workload is not None:
            by_workload[r.workload].append(r)
    found = {}
    for workload, mine in by_workload.items():
        acked = [i for i, r in enumerate(mine) if r.acknowledged]
        if not acked:
            continue
        final = mine[acked[-1]]
        expected = set(OUTCOMES[final.action])
        for r in mine[acked[-1] + 1 :]:
            if r.uncertain:
                expected |= OUTCOMES[r.action]
        found[workload] = Asked(final, frozenset(expected))
    return found


def converged(record: Record) -> list[Violation]:
    """I3 (see the module): every acknowledged request converged, none was lost."""
    found = _idempotency(record.requests)
    last = last_transitions(record.events)
    on_bus = {e.workload for e in record.events}
    placed = placements(record.events)
    running_on: defaultdict[str, list[DesiredValue]] = defaultdict(list)
    for value in final_desired(record.desired).values():
        for w in value.running:
            running_on[w].append(value)
    for workload, wish in sorted(asked(record.requests).items()):
        if workload not in on_bus:
            problems = ["no event of it on the bus: lost"]
        else:
            event = last.get(workload)
            state = event.state if event is not None else None
            problems = _agrees(workload, state, placed.get(workload), record, running_on)
            if state not in wish.expected:
                problems.insert(
                    0,
                    f"{wish.final.action.value} acknowledged at {clock(wish.final.answered or 0)}"
                    f", yet its last state on the bus is {state} ({_event(event)}), not one of "
                    f"{sorted(wish.expected)}",
                )
            elif state in ("failed", "preempted") and event is not None and not event.reason:
                problems.insert(0, f"{state} with no reason")
        if problems:
            evidence = "; ".join(problems)
            found.append(Violation("I3", workload, f"{evidence}; {history(workload, record)}"))
    return found


def _agrees(
    workload: str,
    state: str | None,
    machine: str | None,
    record: Record,
    running_on: dict[str, list[DesiredValue]],
) -> list[str]:
    """Where the api's view or the machines' desired values say otherwise than the events."""
    found = []
    view = record.api.get(workload)
    if view is None:
        found.append(f"the bus says {state}; the api does not know it")
    elif view.state != state:
        found.append(f"the api says {view.state}, the bus {state}")
    elif state == "running" and view.machine != machine:
        found.append(f"running on {machine} (the bus); the api says on {view.machine}")
    desired = running_on.get(workload, [])
    if state == "running" and [v.machine for v in desired] != [machine]:
        where = "; ".join(str(v) for v in desired) or "no machine"
        found.append(f"running on {machine} (the bus); desired on {where}")
    elif state != "running" and desired:
        found.append(f"{state} on the bus, but desired running on " + "; ".join(map(str, desired)))
    return found


def history(workload: str, record: Record) -> str:
    """What was asked of a workload, its transitions and its desired rows, in order: the
    evidence an I3 violation carries."""
    asked_ = [
        f"{r.action.value} {clock(r.sent)}→{r.status if r.status is not None else 'no answer'}"
        for r in sorted(record.requests, key=lambda r: r.sent)
        if r.workload == workload
    ]
    moves = [
        f"{e.seq}:{e.state}@{clock(e.at)}"
        for e in sorted(record.events, key=lambda e: e.seq)
        if e.workload == workload and e.transition
    ]
    desired: list[str] = []
    for v in sorted(record.desired, key=lambda v: v.seq):
        row = next((r for r in v.rows if r.workload == workload), None)
        if row is not None:
            step = f"{v.machine} {row.target} gen {v.generation}@{clock(v.at)}"
            if not desired or desired[-1].rsplit(" gen ", 1)[0] != step.rsplit(" gen ", 1)[0]:
                desired.append(step)
    return (
        f"asked [{', '.join(asked_)}]; events [{', '.join(moves)}]; desired [{' → '.join(desired)}]"
    )


def _idempotency(requests: Sequence[Request]) -> list[Violation]:
    made: defaultdict[str, set[str]] = defaultdict(set)
    for r in requests:
        if r.key is not None and r.acknowledged and r.workload is not None:
            made[r.key].add(r.workload)
    return [
        Violation("I3", key, f"one Idempotency-Key made {len(ids)} workloads: {sorted(ids)}")
        for key, ids in sorted(made.items())
        if len(ids) > 1
    ]


def _event(event: Event | None) -> str:
    if event is None:
        return "no transition"
    return f"seq {event.seq} at {clock(event.at)}: {event.reason!r}"
