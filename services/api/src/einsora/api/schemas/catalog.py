"""Catalog, region and machine bodies."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from einsora.api.schemas.common import Page
from einsora.api.schemas.machines import MachineEnrolment
from einsora.common.catalog import Accelerator
from einsora.common.schemas import Inventory


class ClassOut(BaseModel):
    """A class a workload can name, and the regions whose machines offer it now."""

    name: str
    accelerator: Accelerator
    description: str
    model: str | None
    memory_gib: float
    cpus: float
    regions: list[str]


class ClassPage(Page[ClassOut]):
    pass


class RegionOut(BaseModel):
    name: str
    machines: int


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
