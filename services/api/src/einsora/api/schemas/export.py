"""`einsora.workload-export/v1`: one workload's inputs, placements, timeline and usage as one
JSON document, its secrets replaced by `REDACTED` and listed in `redactions`.

The JSON Schema published at `docs/schemas/workload-export-v1.json` is generated from these
models (`python -m einsora.api.schemas.export > docs/schemas/workload-export-v1.json`); a test
checks the file is up to date.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from einsora.api.schemas.workloads import PlacementOut, TimelineEntryOut
from einsora.common.schemas import WorkloadKind, WorkloadState

SchemaName = Literal["einsora.workload-export/v1"]
SCHEMA: SchemaName = "einsora.workload-export/v1"
SCHEMA_ID = "https://einsora.dev/schemas/workload-export-v1.json"


class ExportedWorkloadOut(BaseModel):
    """The workload's inputs as submitted (its spec redacted), and where it is now."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    id: str
    tenant_id: str
    name: str
    kind: WorkloadKind
    class_name: str = Field(alias="class")
    count: int
    region: str
    spec: dict[str, Any] = Field(description="As submitted, every secret in it `REDACTED`")
    fallback: list[dict[str, Any]] = Field(
        description='Its fallback chain, e.g. [{"class": "a100-80gb"}, {"region": "office"}]'
    )
    fallback_after_s: float = 0.0
    state: WorkloadState = Field(description="Its state when exported")
    placement: PlacementOut | None = Field(description="Where it runs when exported")
    created_at: datetime
    updated_at: datetime
    replica_of: str | None = None


class PlacementEntryOut(BaseModel):
    """One placement the scheduler made, from the timeline: when, where, as which class, and
    why."""

    at: datetime
    state: WorkloadState
    region: str | None = Field(
        default=None, description="The region it was placed in (null: recorded before it was kept)"
    )
    machine: str = Field(description="The machine it was placed on")
    placed_class: str | None = Field(
        default=None, description="The class it was placed as (null: recorded before it was kept)"
    )
    reason: str


class AllocationSumOut(BaseModel):
    """Hours held in one group (a day, YYYY-MM-DD, or a placed class)."""

    group: str
    gpu_hours: float
    cpu_core_hours: float


class TokenCountOut(BaseModel):
    """Tokens the endpoint (or one of its replicas) served to one gateway key, by where the
    count came from."""

    key_id: str
    key_name: str | None = Field(description="The key's name (null: no such key in the tenant)")
    source: str = Field(
        description="upstream, tokenizer or estimate; unknown for hours counted before "
        "accounting kept the source"
    )
    prompt_tokens: int
    completion_tokens: int


class ExportUsageOut(BaseModel):
    """What accounting metered for this workload in [from, to): from its launch to the export."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    start: datetime = Field(alias="from")
    end: datetime = Field(alias="to")
    gpu_hours: float
    cpu_core_hours: float
    by_day: list[AllocationSumOut] = Field(description="Split at midnight UTC, by day")
    by_placed_class: list[AllocationSumOut]
    tokens: list[TokenCountOut] = Field(
        description="An endpoint's tokens (its replicas' included) by gateway key and count "
        "source, by key id then source; empty for a workload that serves no tokens"
    )
    truncated: bool = Field(description="True when accounting had more groups than it sent")


class RedactionOut(BaseModel):
    """One secret replaced by `REDACTED`: where in this document, and what kind it was."""

    path: str = Field(examples=["$.workload.spec.env.HF_TOKEN"])
    kind: str = Field(examples=["huggingface token"])


class WorkloadExportOut(BaseModel):
    """`GET /v1/workloads/{id}/export`: everything about one workload, in one document."""

    model_config = ConfigDict(
        populate_by_name=True,
        serialize_by_alias=True,
        title="einsora.workload-export/v1",
        json_schema_extra={"$id": SCHEMA_ID},
    )

    schema_: SchemaName = Field(alias="schema", default=SCHEMA)
    exported_at: datetime
    workload: ExportedWorkloadOut
    placement_history: list[PlacementEntryOut] = Field(description="Oldest first")
    timeline: list[TimelineEntryOut] = Field(description="Complete, oldest first")
    usage: ExportUsageOut | None = Field(description="Null when it cannot be given (see `notes`)")
    notes: list[str] = Field(description="What this export leaves out, and why")
    redactions: list[RedactionOut] = Field(
        description="Every secret replaced by `REDACTED`: nothing is removed silently"
    )


def json_schema() -> dict[str, Any]:
    """The document's JSON Schema (draft 2020-12), as published in `docs/schemas/`."""
    schema = WorkloadExportOut.model_json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def json_schema_text() -> str:
    """The published file's exact text."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(json_schema_text(), end="")
