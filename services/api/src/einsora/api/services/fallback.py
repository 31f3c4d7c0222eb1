"""A launch's fallback chain, checked step by step against what exists (ADR-0022).

Each step is checked in the context the steps before it leave (the class and the region in
effect), and a step that could never be used is a 422 that names it (`fallback.2`) and says
why: a class the catalog lacks or already in effect, a machine the caller may not use or that
lacks the class in effect, a region nobody knows or the chain has been in, a model that is not
another of the tenant's endpoints, a replica count an endpoint does not exceed. A machine step
is stored with the machine's region (its enrolment's), which the scheduler needs to reach it.
The chain is then what the scheduler walks and the gateway follows; it is checked once, here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from einsora.api.errors import field_error
from einsora.api.schemas.workloads import FallbackStepIn, WorkloadCreate
from einsora.api.views.machines import MachineRecord
from einsora.common.catalog import Catalog
from einsora.common.schemas import StepKind, WorkloadKind


@dataclass(frozen=True)
class ChainContext:
    """What a chain's steps are checked against."""

    catalog: Catalog
    regions: Collection[str]
    """The regions a launch may name (`workloads.known_regions`)."""
    machines: Mapping[str, MachineRecord]
    """The machines the caller may use, by id (enrolled, not revoked)."""
    endpoints: Collection[str]
    """The names of the tenant's live endpoints (only read when a model step is given)."""


def has_steps(body: WorkloadCreate, *kinds: StepKind) -> bool:
    """Whether the launch's chain has a step of one of `kinds`."""
    return any(_kind(step) in kinds for step in body.fallback)


def check_fallback(
    body: WorkloadCreate, asked_region: str, replicas: int, ctx: ChainContext
) -> list[dict[str, Any]]:
    """The chain as stored and sent in its intents, or a 422 naming the first bad step."""
    class_name, region = body.class_name, asked_region
    visited = {asked_region}
    models: set[str] = set()
    chain: list[dict[str, Any]] = []
    for i, step in enumerate(body.fallback):
        field = f"fallback.{i}"
        kind = _kind(step)
        if kind is StepKind.class_:
            assert step.class_name is not None
            if ctx.catalog.get(step.class_name) is None:
                raise field_error(
                    field, f"no class {step.class_name!r} in the catalog (see /v1/classes)"
                )
            if step.class_name == class_name:
                raise field_error(field, f"{step.class_name} is the class in effect already")
            class_name = step.class_name
            chain.append({"class": class_name})
        elif kind is StepKind.machine:
            assert step.machine is not None
            region = _machine_region(field, step.machine, class_name, ctx)
            visited.add(region)
            chain.append({"machine": step.machine, "region": region})
        elif kind is StepKind.region:
            assert step.region is not None
            if step.region not in ctx.regions:
                known = ", ".join(sorted(ctx.regions))
                raise field_error(
                    field,
                    f"no region {step.region!r}; the known regions are: {known} (see /v1/regions)",
                )
            if step.region in visited:
                raise field_error(field, f"the chain is in region {step.region} already")
            region = step.region
            visited.add(region)
            chain.append({"region": region})
        elif kind is StepKind.model:
            assert step.model is not None
            _check_model(field, body, step.model, models, ctx)
            models.add(step.model)
            chain.append({"model": step.model})
        else:
            assert step.replicas is not None
            _check_replicas(field, body, step.replicas, replicas)
            chain.append({"replicas": step.replicas})
    return chain


def _kind(step: FallbackStepIn) -> StepKind:
    if step.class_name is not None:
        return StepKind.class_
    if step.machine is not None:
        return StepKind.machine
    if step.region is not None:
        return StepKind.region
    if step.model is not None:
        return StepKind.model
    return StepKind.replicas


def _machine_region(field: str, machine_id: str, class_name: str, ctx: ChainContext) -> str:
    record = ctx.machines.get(machine_id)
    if record is None or record.region is None:
        raise field_error(
            field, f"no machine {machine_id!r} that you may use (see einsora machines)"
        )
    if record.inventory is None:
        raise field_error(
            field, f"{machine_id} has not said what it has yet; launch again once it reports"
        )
    offered = sorted(c.name for c in ctx.catalog.offered_by(record.inventory))
    if class_name not in offered:
        has = ", ".join(offered) or "no class of the catalog"
        raise field_error(
            field,
            f"{machine_id} offers no {class_name}, the class in effect at this step (it "
            f"offers {has}); put a class step before it",
        )
    return record.region


def _check_model(
    field: str, body: WorkloadCreate, model: str, seen: set[str], ctx: ChainContext
) -> None:
    if body.kind is not WorkloadKind.endpoint:
        raise field_error(field, "a model step is for endpoints only")
    if model == body.name:
        raise field_error(field, f"{model!r} is this endpoint's own name")
    if model in seen:
        raise field_error(field, f"model {model!r} is in the chain already")
    if model not in ctx.endpoints:
        raise field_error(
            field,
            f"no endpoint named {model!r} in your tenant (see einsora endpoints); launch it first",
        )


def _check_replicas(field: str, body: WorkloadCreate, accepted: int, replicas: int) -> None:
    if body.kind is not WorkloadKind.endpoint:
        raise field_error(field, "a replicas step is for endpoints only")
    if accepted >= replicas:
        raise field_error(
            field,
            f"accepting {accepted} replicas is no fallback for an endpoint of {replicas} "
            f"(spec.replicas); give fewer than {replicas}",
        )
