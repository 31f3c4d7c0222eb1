"""Workload and timeline bodies. The catalog check (does `class` exist?) happens in the domain,
which names the field the same way pydantic does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from einsora.api.schemas.common import Label, Page, PageQuery, RequestBody
from einsora.common.catalog import CLASS_NAME
from einsora.common.schemas import (
    MAX_FALLBACK_AFTER_S,
    MAX_STEPS,
    EventKind,
    WorkloadKind,
    WorkloadState,
)

CLASS_PATTERN = CLASS_NAME
"""A class's name, as the catalog spells them (a MIG class has a dot: `h200-1g.18gb`)."""
REGION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MAX_SPEC_BYTES = 64 * 1024
"""A spec is a workload's inputs (image, model, env), not its data."""

ClassName = Annotated[str, Field(pattern=CLASS_PATTERN, examples=["cpu-1c-2g"])]
MACHINE_PATTERN = r"^m-[a-z0-9]{1,62}$"


class FallbackStepIn(RequestBody):
    """One substitute of a fallback chain: exactly one of its fields (ADR-0022)."""

    class_name: ClassName | None = Field(
        default=None, alias="class", description="another class of the catalog (CPU ones too)"
    )
    machine: str | None = Field(
        default=None, pattern=MACHINE_PATTERN, description="one machine you may use"
    )
    region: str | None = Field(
        default=None, pattern=REGION_PATTERN, description="the next region's scheduler"
    )
    model: Label | None = Field(
        default=None,
        description="an endpoint's: another of your endpoints, where the gateway sends its "
        "requests when no replica of this one answers",
    )
    replicas: int | None = Field(
        default=None, ge=1, description="an endpoint's: accept this many replicas"
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> FallbackStepIn:
        given = [
            v
            for v in (self.class_name, self.machine, self.region, self.model, self.replicas)
            if v is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "a step names exactly one of class, machine, region, model or replicas"
            )
        return self


class WorkloadCreate(RequestBody):
    """`POST /v1/workloads`: what to launch."""

    name: Label | None = None
    kind: WorkloadKind
    class_name: ClassName = Field(alias="class")
    count: int = Field(default=1, ge=1, le=64)
    region: str | None = Field(default=None, pattern=REGION_PATTERN)
    spec: dict[str, Any] = Field(default_factory=dict)
    fallback: list[FallbackStepIn] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Opt-in substitutes, tried in order when what it asks for has no room: "
        '{"class": …}, {"machine": …}, {"region": …}, and for endpoints {"model": …} and '
        '{"replicas": n}',
        examples=[[{"class": "a100-80gb"}, {"class": "cpu-8c-32g"}]],
    )
    fallback_after_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_FALLBACK_AFTER_S,
        description="How long it stays queued at one step before the next is tried (0: at once)",
    )

    @field_validator("spec")
    @classmethod
    def _spec_is_plain_bounded_json(cls, spec: dict[str, Any]) -> dict[str, Any]:
        try:
            size = len(spec_json(spec))
        except ValueError as exc:
            raise ValueError("must be plain JSON (no NaN or Infinity)") from exc
        if size > MAX_SPEC_BYTES:
            raise ValueError(f"is {size} bytes as JSON; the limit is {MAX_SPEC_BYTES}")
        return spec


def spec_json(spec: dict[str, Any]) -> str:
    """The stored form of a spec: compact, ASCII-only JSON (no NUL byte reaches the store)."""
    return json.dumps(spec, allow_nan=False, separators=(",", ":"), sort_keys=True)


class HostOut(BaseModel):
    """The host of a workload placed on another tenant's machine, who can see its data."""

    machine: str
    owner_tenant: str = Field(description="the machine owner's tenant, by name")
    note: str = Field(examples=["runs on m-… owned by alice, who can see its data"])


class PlacementOut(BaseModel):
    """Where a workload runs: region, machine and the class it was placed as."""

    region: str
    machine: str
    placed_class: str
    host: HostOut | None = Field(
        default=None,
        description="set when the machine belongs to another tenant, whose people can see the "
        "workload's data; null on your own tenant's machines",
    )


class WorkloadOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    id: str
    tenant_id: str
    name: str
    kind: WorkloadKind
    class_name: str = Field(alias="class")
    count: int
    region: str
    spec: dict[str, Any]
    fallback: list[dict[str, Any]] = Field(
        description="Its fallback chain as given (a machine step shows the machine's region)"
    )
    fallback_after_s: float = 0.0
    state: WorkloadState
    placement: PlacementOut | None = None
    created_at: datetime
    updated_at: datetime
    replica_of: str | None = Field(
        default=None,
        description="For an endpoint's further replicas: the endpoint (its first replica), "
        "which the user acts on for all of them",
    )


class WorkloadPage(Page[WorkloadOut]):
    pass


class WorkloadListQuery(PageQuery):
    state: WorkloadState | None = None
    kind: WorkloadKind | None = None


class TimelineEntryOut(BaseModel):
    """One timeline entry: a transition (the state changed) or a note (a decision)."""

    at: datetime
    kind: EventKind
    state: WorkloadState
    reason: str
    request_id: str | None = None


class TimelinePage(Page[TimelineEntryOut]):
    pass
