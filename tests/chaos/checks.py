"""The invariants of DESIGN.md, checked over a run's record: plain functions over plain data.

Each check returns the violations it found, each with its evidence (the workload or machine,
the values, the times), so a failed run says what broke without a rerun. What each one reads:
- I1 (`one_machine`): the desired values, in the order the bus stored them. A workload is in
  at most one machine's current value with target `running`, and a GPU is in at most one
  workload's row of one value, and of the machines' current values. One cycle's values reach
  the bus one after another, so an overlap across machines counts once it outlives `slack_s`
  (or lasts to the end); within one value, at once.
- I2 (`metering.usage_matches`, `metering.lost_timed_from_last_report`): accounting's usage
  against the allocations the events make.
- I3 (`convergence.converged`): every acknowledged request against the workload's last state
  on the bus, the api's view and the machines' last desired values.
- I4 (`generations_grow`): each machine's desired generations, as written.
- I5 (`metering.closed_once`): accounting's allocations against the events'.
- I6 (`no_ping_pong`): preemptions and placements in the events.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tests.chaos.model import (
    LEADER_LOSSES,
    Action,
    DesiredValue,
    Event,
    Fault,
    LeaderBeat,
    Request,
    clock,
)

INVARIANTS = ("I1", "I2", "I3", "I4", "I5", "I6")
TAKEOVER = "takeover"
"""Not an invariant, but what issue 35 asks of every leader loss: a new leader within a bound."""


@dataclass(frozen=True)
class Violation:
    invariant: str
    subject: str
    """The workload, machine or GPU it is about."""
    evidence: str

    def __str__(self) -> str:
        return f"{self.invariant} {self.subject}: {self.evidence}"


# --- I1 -----------------------------------------------------------------------------------------


def one_machine(values: Sequence[DesiredValue], *, slack_s: float, end: float) -> list[Violation]:
    """I1 over every desired value the bus stored (see the module)."""
    found: list[Violation] = []
    current: dict[str, DesiredValue] = {}
    running_on: defaultdict[str, set[str]] = defaultdict(set)
    held_by: defaultdict[str, set[tuple[str, str]]] = defaultdict(set)
    overlaps: dict[tuple[str, str], tuple[float, str]] = {}
    for value in sorted(values, key=lambda v: v.seq):
        found.extend(_gpus_twice_in(value))
        old = current.pop(value.machine, None)
        touched: set[tuple[str, str]] = set()
        for v, add in ((old, False), (None if value.deleted else value, True)):
            if v is None:
                continue
            for w in v.running:
                (running_on[w].add if add else running_on[w].discard)(v.machine)
                touched.add(("workload", w))
            for row in v.rows:
                for gpu in row.gpus:
                    holder = (v.machine, row.workload)
                    (held_by[gpu].add if add else held_by[gpu].discard)(holder)
                    touched.add(("gpu", gpu))
        if not value.deleted:
            current[value.machine] = value
        for key in sorted(touched):
            if key[0] == "workload":
                twice = len(running_on[key[1]]) > 1
            else:  # one value's own double booking is found above, at once
                machines = {m for m, _ in held_by[key[1]]}
                twice = len(machines) > 1 and len({w for _, w in held_by[key[1]]}) > 1
            if twice and key not in overlaps:
                overlaps[key] = (value.at, _overlap(key, current, running_on, held_by))
            elif not twice and key in overlaps:
                since, evidence = overlaps.pop(key)
                if value.at - since > slack_s:
                    found.append(
                        Violation(
                            "I1",
                            key[1],
                            f"{evidence}; for {value.at - since:.1f} s, until {value}",
                        )
                    )
    for key, (since, evidence) in sorted(overlaps.items()):
        found.append(
            Violation("I1", key[1], f"{evidence}; still so at the end ({end - since:.1f} s)")
        )
    return found


def _gpus_twice_in(value: DesiredValue) -> list[Violation]:
    owner: dict[str, str] = {}
    found = []
    for row in value.rows:
        for gpu in row.gpus:
            first = owner.setdefault(gpu, row.workload)
            if first != row.workload:
                found.append(
                    Violation(
                        "I1",
                        gpu,
                        f"booked to {first} and to {row.workload} in one desired value: {value}",
                    )
                )
    return found


def _overlap(
    key: tuple[str, str],
    current: dict[str, DesiredValue],
    running_on: dict[str, set[str]],
    held_by: dict[str, set[tuple[str, str]]],
) -> str:
    what, name = key
    if what == "workload":
        where = "; ".join(str(current[m]) for m in sorted(running_on[name]))
        return f"running on {len(running_on[name])} machines at once: {where}"
    where = "; ".join(f"{w} in {current[m]}" for m, w in sorted(held_by[name]))
    return f"booked to several workloads at once: {where}"


# --- I4 -----------------------------------------------------------------------------------------


def generations_grow(values: Sequence[DesiredValue]) -> list[Violation]:
    """I4: each machine's desired generation never goes back, and one generation is one value
    (the same generation carries the same rows: a rewrite is harmless, another value is not)."""
    found: list[Violation] = []
    top: dict[str, DesiredValue] = {}
    for value in sorted(values, key=lambda v: v.seq):
        if value.deleted:
            continue
        best = top.get(value.machine)
        if best is not None and value.generation < best.generation:
            found.append(
                Violation(
                    "I4",
                    value.machine,
                    f"generation {value.generation} written (seq {value.seq}, "
                    f"{clock(value.at)}) after generation {best.generation} "
                    f"(seq {best.seq}, {clock(best.at)}): {_rows(value)}",
                )
            )
            continue
        if best is not None and value.generation == best.generation and not value.same_rows(best):
            found.append(
                Violation(
                    "I4",
                    value.machine,
                    f"two values at generation {value.generation}: seq {best.seq} "
                    f"({clock(best.at)}) {_rows(best)} and seq {value.seq} ({clock(value.at)}) "
                    f"{_rows(value)}",
                )
            )
        top[value.machine] = value
    return found


def _rows(value: DesiredValue) -> str:
    return "[" + ", ".join(f"{r.workload} {r.target}" for r in value.rows) + "]"


# --- I6 -----------------------------------------------------------------------------------------


def no_ping_pong(events: Sequence[Event], requests: Sequence[Request]) -> list[Violation]:
    """I6: no workload is preempted twice, and none goes back to a machine it was moved off
    without a launch or resume asked in between (a running workload never moves by itself)."""
    found: list[Violation] = []
    asked: defaultdict[str, list[float]] = defaultdict(list)
    for r in requests:
        if r.workload is not None and r.action in (Action.create, Action.resume):
            asked[r.workload].append(r.sent)
    by_workload: defaultdict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.transition:
            by_workload[e.workload].append(e)
    for workload, mine in sorted(by_workload.items()):
        mine.sort(key=lambda e: e.seq)
        preempted = [e for e in mine if e.state == "preempted"]
        if len(preempted) > 1:
            times = ", ".join(clock(e.at) for e in preempted)
            found.append(Violation("I6", workload, f"preempted {len(preempted)} times: {times}"))
        visited: list[str] = []
        since = float("-inf")
        for e in mine:
            if e.state != "scheduled" or e.machine is None:
                continue
            if any(since < t <= e.at for t in asked[workload]):
                visited = []
            since = e.at
            if visited and e.machine != visited[-1] and e.machine in visited:
                path = " → ".join([*visited, e.machine])
                found.append(Violation("I6", workload, f"moved back and forth by itself: {path}"))
            visited.append(e.machine)
    return found


# --- takeovers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Takeover:
    fault: Fault
    seconds: float | None
    """From the loss to the new leader's first heartbeat; None: no new leader was seen."""
    holder: str | None


def takeovers(
    faults: Sequence[Fault], beats: Sequence[LeaderBeat], region: str = "local"
) -> list[Takeover]:
    """Every leader loss, and how long until a later term's first heartbeat."""
    found = []
    ordered = sorted((b for b in beats if b.region == region), key=lambda b: b.seq)
    for fault in faults:
        if fault.kind not in LEADER_LOSSES or fault.lost_term is None:
            continue
        first = next(
            (
                b
                for b in ordered
                if b.term > fault.lost_term and b.at >= fault.at - 0.001 and not b.released
            ),
            None,
        )
        found.append(
            Takeover(
                fault,
                None if first is None else max(0.0, first.at - fault.at),
                None if first is None else first.holder,
            )
        )
    return found


def slow_takeovers(found: Sequence[Takeover], limit_s: float) -> list[Violation]:
    return [
        Violation(
            TAKEOVER,
            t.fault.target,
            f"{t.fault.kind.value} at {clock(t.fault.at)} (term {t.fault.lost_term}): "
            + (
                "no later term ever heartbeat"
                if t.seconds is None
                else f"the new leader {t.holder} first heartbeat {t.seconds:.2f} s later "
                f"(limit {limit_s:g} s)"
            ),
        )
        for t in found
        if t.seconds is None or t.seconds > limit_s
    ]
