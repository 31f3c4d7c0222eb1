"""Catalog, region and machine bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from einsora.api.schemas.common import Page
from einsora.api.schemas.machines import MachineEnrolment
from einsora.common.catalog import Accelerator
from einsora.common.schemas import Inventory


class ClassOut(BaseModel):
    """A class a workload can name, and the regions where machines you may use offer it now."""

    name: str
    accelerator: Accelerator
    description: str
    model: str | None
    memory_gib: float
    cpus: float
    mig_profile: str | None = Field(
        default=None,
        description="a class of MIG slices of this profile (e.g. 1g.18gb) of `model` GPUs; "
        "null: whole GPUs (or a CPU class)",
    )
    automatic: bool = Field(
        default=False,
        description="derived from a machine's devices that no class of the catalog names (a "
        "new GPU model, or a MIG profile), not configured; listed only where offered",
    )
    regions: list[str] = Field(
        description="the regions where machines you may use offer it now, counting only what "
        "their owners lend"
    )
    free: int | None = Field(
        default=None,
        description="how many workloads of this class (count 1) the machines you may use could "
        "take now: an estimate from what their owners lend and what is placed there (the "
        "scheduler decides); null when not counted",
    )


class ClassPage(Page[ClassOut]):
    pass


class SchedulerOut(BaseModel):
    """A region's scheduler, as its last heartbeat says (ADR-0022)."""

    state: Literal["up", "down", "unknown"] = Field(
        description="down: it stopped or went silent; unknown: none has reported since this "
        "api started"
    )
    last_seen: datetime | None = Field(description="its last heartbeat (its own clock)")
    reason: str | None = Field(
        default=None,
        description="why launches there wait, while it is down",
        examples=["region office's scheduler is not reporting (last heard of at 12:00:01 UTC)"],
    )


class RegionOut(BaseModel):
    """A region: its machines, its scheduler's liveness, and its free capacity per class."""

    name: str
    machines: int = Field(description="machines enrolled in it")
    scheduler: SchedulerOut
    available_machines: int = Field(
        default=0, description="of them, those its scheduler can place on now"
    )
    free: dict[str, int] = Field(
        default_factory=dict,
        description="by class, as its scheduler last said: free devices of a GPU class; for "
        "a CPU class, how many of it would fit",
    )
    queued: int = Field(default=0, description="workloads waiting there for room")


class RegionPage(Page[RegionOut]):
    pass


class MachineOut(BaseModel):
    """A machine: its enrolment (owner, sharing, when enrolled and revoked), and what its agent
    reports (inventory, last heartbeat, workloads it runs)."""

    id: str
    region: str | None = Field(description="its enrolment's region; null unless enrolled")
    enrolment: MachineEnrolment | None = Field(description="null: it reports but is not enrolled")
    inventory: Inventory | None
    heartbeat_at: datetime | None
    workloads: int


class MachinePage(Page[MachineOut]):
    pass
