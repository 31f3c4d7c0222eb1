"""What accounting holds, as plain data: allocations, and what applying events did."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from einsora.common.schemas import Metered, WorkloadState

METERED_STATES = frozenset({WorkloadState.running})
"""The states whose time is metered (the glossary's "Metered")."""


@dataclass
class Allocation:
    """A stretch of time a workload held its resources in a metered state; open until
    `ended_at` is set."""

    workload_id: str
    tenant_id: str
    kind: str
    class_name: str
    placed_class: str
    region: str
    machine: str
    gpus: list[str]
    cpus: float
    memory_mib: int
    started_at: datetime
    opened_by_event: str
    ended_at: datetime | None = None
    closed_by_event: str | None = None
    id: int | None = None
    opened_seq: int | None = None
    """The `seq` of the event that opened it (None: before transitions were kept, or imported)."""
    closed_seq: int | None = None
    """The `seq` of the event that closed it, in the workload's order (None while open)."""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def is_open(self) -> bool:
        return self.ended_at is None

    def seconds(self, now: datetime) -> float:
        """Seconds held: to its end, or to `now` while open."""
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, (end - self.started_at).total_seconds())


def opened_at(
    workload_id: str, tenant_id: str, held: Metered, at: datetime, event_id: str, seq: int
) -> Allocation:
    """The allocation a transition into a metered state opens, holding `held` from `at`."""
    return Allocation(
        workload_id=workload_id,
        tenant_id=tenant_id,
        kind=held.kind.value,
        class_name=held.class_name,
        placed_class=held.placed_class,
        region=held.region,
        machine=held.machine,
        gpus=list(held.gpus),
        cpus=float(held.cpus),
        memory_mib=int(held.memory_mib),
        started_at=at,
        opened_by_event=event_id,
        opened_seq=seq,
    )


@dataclass
class Applied:
    """What one batch of events changed (for metrics and the usage KV)."""

    events: int = 0
    """Transitions taken in: newer than the workload's last applied `seq`, or late ones not
    applied before."""
    ignored: int = 0
    """Events that changed nothing: applied before, or from before transitions were kept."""
    opened: int = 0
    closed: int = 0
    gpu_seconds: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    """GPU-seconds of the allocations closed, by (tenant, placed class); a close a late event
    moved earlier counts its change (below zero when that is all the batch did)."""
    tenants: set[str] = field(default_factory=set)
    """Tenants whose usage changed."""

    @property
    def metered(self) -> int:
        """Events that opened or closed an allocation."""
        return self.opened + self.closed
