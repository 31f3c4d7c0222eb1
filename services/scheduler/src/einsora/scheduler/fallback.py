"""The fallback step: a workload's chain resolved into targets, and what each has room for.

A workload's `fallback` (ADR-0022) is resolved once into **targets**: target 0 is the class and
region it asked for; each class step changes the class, a machine step pins one machine (in
its region), a region step moves to the next region with the class in effect, and a replicas
step lets an endpoint's later replicas stop holding up others. Model steps are the gateway's and
are no target. Time decides how far a waiting workload may go: with `fallback_after_s` = 0 it
tries every target at once, otherwise target k is tried once it has waited k times that long.

These are plain functions over the book and the workload: which targets are reached here, and
what each would need (`Demand`). A workload without a chain is a chain of one target
(`targets_here`), so admission, the order and "why it waits" follow one path for both (ADR-0030).
The walk along the chain, and the hand-over to another region, are `chain.py` and
`handover.py`. This module never changes the book.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from einsora.common.schemas import FallbackStep, StepKind, WorkloadIntent
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand, demand_of
from einsora.scheduler.model import Chain, Workload

_PLACING = frozenset({None, StepKind.class_, StepKind.machine, StepKind.region})
"""Targets that place on a machine, in their region (None: the class as asked); a replicas
step places nothing."""


@dataclass(frozen=True)
class Target:
    """One place a workload may run: a class in a region, perhaps on one machine."""

    index: int
    kind: StepKind | None
    """None for target 0, the class and region as asked."""
    region: str
    class_name: str
    machine: str | None = None
    replicas: int | None = None

    @property
    def places(self) -> bool:
        return self.kind in _PLACING

    def label(self) -> str:
        """How a note names it when the chain moves on to it."""
        if self.kind is StepKind.machine:
            return f"{self.machine} ({self.class_name})"
        if self.kind is StepKind.region:
            return f"region {self.region}"
        if self.kind is StepKind.replicas:
            return f"fewer replicas ({self.replicas})"
        return self.class_name


def chain_of(intent: WorkloadIntent, asked_region: str) -> Chain | None:
    """The chain an intent asks for; None when it has no step the scheduler acts on (none at
    all, or only the gateway's model steps)."""
    if not any(step.kind is not StepKind.model for step in intent.fallback):
        return None
    return Chain(
        steps=list(intent.fallback),
        after_s=intent.fallback_after_s,
        asked_region=asked_region,
        replica=intent.replica,
    )


def targets(workload: Workload) -> tuple[Target, ...]:
    """The workload's targets in chain order (cached on its chain)."""
    chain = workload.chain
    assert chain is not None
    if chain.targets:
        return chain.targets
    region = chain.asked_region or workload.region
    class_name = workload.class_name
    found = [Target(0, None, region, class_name)]
    for step in chain.steps:
        found.extend(_target(step, len(found), region, class_name))
        if found[-1].kind is not None:
            region, class_name = found[-1].region, found[-1].class_name
    chain.targets = tuple(found)
    return chain.targets


def _target(step: FallbackStep, index: int, region: str, class_name: str) -> list[Target]:
    kind = step.kind
    if kind is StepKind.class_:
        return [Target(index, kind, region, str(step.class_name))]
    if kind is StepKind.machine:
        return [Target(index, kind, step.region or region, class_name, machine=step.machine)]
    if kind is StepKind.region:
        return [Target(index, kind, str(step.region), class_name)]
    if kind is StepKind.replicas:
        return [Target(index, kind, region, class_name, replicas=step.replicas)]
    return []  # a model step is the gateway's


def reachable(workload: Workload, now: datetime) -> int:
    """The furthest target its chain may try now (its timer: one more every `after_s`)."""
    chain = workload.chain
    assert chain is not None
    last = len(targets(workload)) - 1
    if chain.after_s <= 0:
        return last
    if chain.since is None:
        return min(last, chain.start)
    waited = (now - chain.since).total_seconds()
    return min(last, max(chain.start, int(waited // chain.after_s)))


def next_at(workload: Workload) -> datetime | None:
    """When its timer reaches the next target (None: no timer, or every target is reached)."""
    chain = workload.chain
    assert chain is not None
    if chain.after_s <= 0 or chain.since is None or chain.reached >= len(targets(workload)) - 1:
        return None
    return chain.since + timedelta(seconds=chain.after_s * (chain.reached + 1))


def tried_here(book: Book, workload: Workload) -> list[Target]:
    """The targets of this region its chain has reached in this turn, in chain order: the
    ones it waits for (in their pools)."""
    chain = workload.chain
    assert chain is not None
    return [
        t
        for t in targets(workload)[chain.start : chain.reached + 1]
        if t.places and t.region == book.region
    ]


def targets_here(book: Book, workload: Workload) -> list[Target]:
    """The targets of this region the workload waits for now, in chain order. A workload
    without a chain is a chain of one: the class it asked for, here."""
    if workload.chain is None:
        return [Target(0, None, book.region, workload.class_name)]
    return tried_here(book, workload)


def demand_for(book: Book, workload: Workload, target: Target) -> Demand | None:
    """What the workload asks of a machine at `target` (None: a class this catalog lacks)."""
    return demand_of(book.catalog, workload, target.class_name)
