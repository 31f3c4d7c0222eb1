"""The data of event-stream (SSE) events: a `snapshot` of current states, then each `workload`
change as the scheduler publishes it.

`seq` is the EVENTS stream's sequence, the same number as the SSE event's `id`: a client that
reconnects sends it back as `Last-Event-ID` and gets what came after it.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from einsora.api.schemas.workloads import PlacementOut
from einsora.common.schemas import EventKind, WorkloadState


class WorkloadChangeOut(BaseModel):
    """One change of a workload (`event: workload`), or its latest state in a snapshot."""

    seq: int = Field(description="the EVENTS stream sequence: the SSE `id` of this event")
    workload_id: str
    kind: EventKind = Field(
        description="`transition` (the state changed) or `note` (a decision; same state)"
    )
    state: WorkloadState
    reason: str
    at: datetime
    placement: PlacementOut | None = Field(
        default=None,
        description="where it was placed, on the change that placed it (and in a snapshot, "
        "once placed); null when this change says nothing about placement",
    )
    request_id: str | None = None


class SnapshotOut(BaseModel):
    """`event: snapshot`: the current state of the workloads the stream follows, from the
    store, first on a fresh stream (and again when a `Last-Event-ID` is no longer held)."""

    seq: int = Field(description="the changes that follow have higher sequences")
    workloads: list[WorkloadChangeOut]


SNAPSHOT = "snapshot"
CHANGE = "workload"
EVENT_DATA: dict[str, type[BaseModel]] = {SNAPSHOT: SnapshotOut, CHANGE: WorkloadChangeOut}
"""Each SSE event name and the model of its data (for the document)."""
