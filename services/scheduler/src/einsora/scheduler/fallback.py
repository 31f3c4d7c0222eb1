"""The fallback step: a workload's chain resolved into targets, and what each has room for.

A workload's `fallback` (ADR-0022) is resolved once into **targets**: target 0 is the class and
region it asked for; each class step changes the class, a machine step pins one machine (in
its region), a region step moves to the next region with the class in effect, and a replicas
step lets an endpoint's later replicas stop holding up others. Model steps are the gateway's and
are no target. Time decides how far a waiting workload may go: with `fallback_after_s` = 0 it
tries every target at once, otherwise target k is tried once it has waited k times that long.

These are plain functions over the book and the workload: which targets are reached here,
what each would need (`Demand`), whether a pinned machine fits it, whether a workload holds a
pool up (the strict order of ADR-0003 and ADR-0014 holds in every pool a chain waits in), and
the sentence that says why a target has no room. The walk along the chain, and the hand-over
to another region, are `chain.py` and `handover.py`; admission asks this module which target a
chained workload takes in a pool. This module never changes the book.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from einsora.common.schemas import FallbackStep, StepKind, WorkloadIntent
from einsora.scheduler import quotas, reasons, trust
from einsora.scheduler.book import Book, runtime_needed
from einsora.scheduler.capacity import (
    Demand,
    Grant,
    could_ever_fit,
    fit,
    free_cpus,
    free_memory_mib,
)
from einsora.scheduler.model import Chain, Liveness, Workload

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


def demand_for(book: Book, workload: Workload, target: Target) -> Demand | None:
    """What the workload asks of a machine at `target` (None: a class this catalog lacks)."""
    machine_class = book.catalog.get(target.class_name)
    if machine_class is None:
        return None
    return Demand.of(machine_class, workload.count, runtime_needed(workload))


def pinned_grant(book: Book, workload: Workload, target: Target, demand: Demand) -> Grant | None:
    """What a machine step's machine gives now (None: not here, not placeable, not allowed to
    take the workload, or full)."""
    machine = book.machines.get(target.machine or "")
    if machine is None or not machine.placeable or not book.may_run(machine, workload):
        return None
    return fit(machine, demand)


def ever_fits(book: Book, workload: Workload, target: Target, demand: Demand) -> bool:
    """Whether the target, emptied, would hold the workload (so it waits for it)."""
    if target.machine is None:
        return book.ever_fits_for(workload, demand)
    machine = book.machines.get(target.machine)
    return (
        machine is not None
        and not machine.revoked
        and book.may_run(machine, workload)
        and could_ever_fit([machine], demand)
    )


def holds(book: Book, workload: Workload, pool: str) -> bool:
    """Whether the workload, waiting in `pool`, keeps those behind it there from going first:
    a target of it in the pool is within its quota and would hold it once room frees."""
    if workload.chain is None:
        demand = book.demand_of(workload)
        return (
            demand is not None
            and quotas.refusal(book, workload, demand) is None
            and book.ever_fits_for(workload, demand)
        )
    if workload.chain.optional:
        return False
    for target in tried_here(book, workload):
        demand = demand_for(book, workload, target)
        if demand is None or demand.pool != pool:
            continue
        if quotas.refusal(book, workload, demand) is None and ever_fits(
            book, workload, target, demand
        ):
            return True
    return False


def gives_way(book: Book, workload: Workload, pool: str) -> bool:
    """A replica a `replicas` step made optional takes room in `pool` only when nothing else
    waiting there could use it."""
    chain = workload.chain
    if chain is None or not chain.optional:
        return False
    return any(
        other is not workload and holds(book, other, pool) for other in book.queue.get(pool, ())
    )


def has_turn(book: Book, workload: Workload, pool: str) -> bool:
    """Whether no workload ahead of it in `pool` waits for room there (the strict order)."""
    for ahead in book.admission_order(pool):
        if ahead is workload:
            return True
        if holds(book, ahead, pool):
            return False
    return False


# --- why a target has no room -------------------------------------------------------------


def explain(book: Book, workload: Workload, target: Target) -> str:
    """Why `target` (of this region) has no room for the workload now, as a clause."""
    label = target.label()
    demand = demand_for(book, workload, target)
    if demand is None:
        return reasons.step_unknown_class(label)
    over = quotas.refusal(book, workload, demand)
    if over is not None:
        return reasons.step_over_quota(label, over)
    if target.machine is not None:
        return _explain_machine(book, workload, target, demand)
    if demand.gpu:
        return _explain_gpu(book, workload, target, demand)
    return _explain_cpu(book, workload, target, demand)


def _explain_machine(book: Book, workload: Workload, target: Target, demand: Demand) -> str:
    label = target.label()
    machine = book.machines.get(target.machine or "")
    if machine is None or machine.revoked:
        return reasons.step_no_such_machine(label, book.region)
    if not book.may_run(machine, workload):
        why = trust.why_not(
            machine,
            workload.tenant_id,
            book.owner_tenant,
            book.community_pool,
            workload.user_id,
            sim_machines=book.sim_machines,
            kind=workload.kind,
            spec=workload.spec,
        )
        return f"{label}: {why.split(': ', 1)[-1]}"
    if not machine.placeable:
        alive = machine.liveness is Liveness.alive
        return reasons.step_machine_away(label, "is settling" if alive else "is not reporting")
    if not could_ever_fit([machine], demand):
        return reasons.step_never_fits(label, f"has no {_what(demand)}")
    if demand.gpu:
        total = len(machine.lent_gpus_by_class.get(demand.class_name, []))
        free = book.index.free_devices(machine.machine_id, demand.class_name)
        return reasons.step_gpus_busy(label, "there", free, total, demand.count)
    return reasons.step_cpu_busy(label, "there", _what(demand))


def _explain_gpu(book: Book, workload: Workload, target: Target, demand: Demand) -> str:
    label = target.label()
    usable = [m for m in book.machines.values() if demand.class_name in m.lent_gpus_by_class]
    if not usable:
        return reasons.step_never_fits(label, f"no machine in {book.region} offers it")
    allowed = [m for m in usable if book.may_run(m, workload)]
    if not allowed:
        return reasons.step_never_fits(
            label, f"no machine in {book.region} that has it may take your workloads"
        )
    if not book.ever_fits_for(workload, demand):
        return reasons.step_never_fits(
            label, f"no machine in {book.region} has {demand.count} of it"
        )
    placeable = [m for m in allowed if m.placeable]
    total = sum(len(m.lent_gpus_by_class[demand.class_name]) for m in placeable)
    free = sum(book.index.free_devices(m.machine_id, demand.class_name) for m in placeable)
    if free >= demand.count:
        ahead = _ahead(book, workload, demand.pool)
        return reasons.step_behind(label, f"{free} free in {book.region}", ahead)
    return reasons.step_gpus_busy(label, f"in {book.region}", free, total, demand.count)


def _explain_cpu(book: Book, workload: Workload, target: Target, demand: Demand) -> str:
    label = target.label()
    if not book.ever_fits(demand):
        return reasons.step_never_fits(
            label, f"no machine in {book.region} has {_what(demand)} in total"
        )
    if not book.ever_fits_for(workload, demand):
        return reasons.step_never_fits(
            label, f"no machine in {book.region} that has it may take your workloads"
        )
    fits_now = any(
        m.placeable
        and book.may_run(m, workload)
        and free_cpus(m) >= demand.cpus
        and free_memory_mib(m) >= demand.memory_mib
        for m in book.machines.values()
    )
    if fits_now:
        ahead = _ahead(book, workload, demand.pool)
        return reasons.step_behind(label, f"room in {book.region}", ahead)
    return reasons.step_cpu_busy(label, f"in {book.region}", _what(demand))


def _ahead(book: Book, workload: Workload, pool: str) -> int:
    count = 0
    for other in book.admission_order(pool):
        if other is workload:
            break
        count += holds(book, other, pool)
    return count


def _what(demand: Demand) -> str:
    if demand.gpu:
        return f"{demand.count} {demand.class_name}"
    return f"{demand.cpus:g} cores and {demand.memory_mib / 1024:g} GiB"
