"""Converging: from a machine's complete desired state to a goal for each workload it knows.

A plain function over plain data, so the rules are readable in one place and testable without a
bus or a process: listed workloads get the goal of their target; a workload the agent knows but
the desired state does not list at all is stopped (its directory kept: only an explicit
`removed` target deletes data).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from einsora.common.bus import names
from einsora.common.schemas import DesiredState, DesiredWorkload, Target


class Goal(StrEnum):
    """What the agent does about one workload."""

    run = "run"
    """Start it unless it runs (a workload that failed stays failed until parked or removed)."""
    park = "park"
    """Stop it, keep its directory."""
    remove = "remove"
    """Stop it, delete its directory."""
    drop = "drop"
    """Not in the desired state: stop it, keep its directory, report it removed."""
    hold = "hold"
    """Adopted after a restart, before any desired state: watch it, change nothing."""


GOAL_OF_TARGET = {Target.running: Goal.run, Target.parked: Goal.park, Target.removed: Goal.remove}


@dataclass(frozen=True)
class Assignment:
    """The goal of one workload, with its desired entry when the desired state lists it."""

    workload_id: str
    goal: Goal
    desired: DesiredWorkload | None = None


@dataclass(frozen=True)
class Plan:
    """Every known or listed workload's goal, and the listed ones the agent must refuse."""

    assignments: tuple[Assignment, ...]
    invalid: tuple[str, ...]


def valid_workload_id(workload_id: str) -> bool:
    """Whether an id can name a directory and a record file (letters, digits, `-`, `_`)."""
    return names.is_subject_token(workload_id)


def plan(desired: DesiredState, known: Iterable[str]) -> Plan:
    """The goal of every workload in `desired` and of every `known` one it does not list.

    When an id is listed twice, the last entry wins (the desired state is one value, so this
    only happens through a bug upstream; it must still not crash the agent).
    """
    listed: dict[str, DesiredWorkload] = {}
    invalid: list[str] = []
    for workload in desired.workloads:
        if valid_workload_id(workload.workload_id):
            listed[workload.workload_id] = workload
        elif workload.workload_id not in invalid:
            invalid.append(workload.workload_id)
    assignments = [Assignment(wid, GOAL_OF_TARGET[w.target], w) for wid, w in listed.items()]
    assignments += [Assignment(wid, Goal.drop) for wid in known if wid not in listed]
    return Plan(tuple(assignments), tuple(invalid))
