"""Workload and timeline bodies. The catalog check (does `class` exist?) happens in the domain,
which names the field the same way pydantic does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from einsora.api.schemas.common import Label, Page, PageQuery, RequestBody
from einsora.common.schemas import EventKind, WorkloadKind, WorkloadState

CLASS_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
REGION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MAX_SPEC_BYTES = 64 * 1024
"""A spec is a workload's inputs (image, model, env), not its data."""

ClassName = Annotated[str, Field(pattern=CLASS_PATTERN, examples=["cpu-1c-2g"])]


class WorkloadCreate(RequestBody):
    """`POST /v1/workloads`: what to launch."""

    name: Label | None = None
    kind: WorkloadKind
    class_name: ClassName = Field(alias="class")
    count: int = Field(default=1, ge=1, le=64)
    region: str | None = Field(default=None, pattern=REGION_PATTERN)
    spec: dict[str, Any] = Field(default_factory=dict)
    fallback: list[ClassName] = Field(
        default_factory=list,
        max_length=8,
        description="Substitute classes, in order; not supported yet: a non-empty list is a 422",
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
    fallback: list[str]
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
