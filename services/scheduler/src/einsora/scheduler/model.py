"""The scheduler's records, as plain data: machines, workloads, and the rows of desired state.

These mirror the scheduler's tables one to one (`tables.py`); the store loads and saves them,
and every decision (`admission`, `intents`, `observe`) is a function over them. Nothing here
does I/O.

A `Row` is one workload in one machine's desired state. A machine's desired value is exactly
its rows at its generation, so the rows are the truth and the KV value only a projection. A
workload has at most one row that runs it (on `Workload.machine_id`); a row left on another
machine only cleans up a working directory there (target `removed`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from einsora.common.schemas import (
    FallbackStep,
    Inventory,
    Lend,
    Resources,
    SharingLevel,
    Target,
    WorkloadKind,
    WorkloadState,
)


class Preemption(StrEnum):
    """Why a guest's workload must leave a machine (ADR-0017)."""

    reclaimed = "reclaimed"
    unshared = "unshared"
    unlent = "unlent"


class Liveness(StrEnum):
    """Whether a machine reports: alive, suspect (silent a while), lost (silent too long)."""

    alive = "alive"
    suspect = "suspect"
    lost = "lost"


@dataclass
class Row:
    """One workload in one machine's desired state.

    `since_generation` is the generation at which `target` was set: an observation from an
    agent that has applied less than that is about an older wish and is not acted on.
    """

    workload_id: str
    target: Target
    gpus: list[str] = field(default_factory=list)
    cpus: float = 0.0
    memory_mib: int = 0
    since_generation: int = 0
    driver: str | None = None
    """The driver chosen for it there (`drivers.choose`); None: the agent's default (rows
    from before drivers were chosen)."""

    @property
    def holds_resources(self) -> bool:
        return bool(self.gpus) or self.cpus > 0 or self.memory_mib > 0

    def resources(self) -> Resources:
        return Resources(gpus=list(self.gpus), cpus=self.cpus, memory_mib=self.memory_mib)

    def release(self) -> None:
        self.gpus = []
        self.cpus = 0.0
        self.memory_mib = 0


@dataclass(eq=False)
class Machine:
    """A machine of this region, as the scheduler knows it.

    `generation` is the generation of its desired state in the store; `observed_generation`,
    `last_seen` (monotonic seconds) and `settle_generation` live in memory only.
    """

    machine_id: str
    region: str
    inventory: Inventory
    generation: int = 0
    liveness: Liveness = Liveness.alive
    rows: dict[str, Row] = field(default_factory=dict)
    last_seen: float = 0.0
    observed_generation: int = 0
    settle_generation: int = 0
    """After coming back, no new work lands here until it has applied this generation."""
    gpus_by_class: dict[str, list[str]] = field(default_factory=dict)
    """Healthy GPU uuids by catalog class, in device order (derived from the inventory)."""
    lent_gpus_by_class: dict[str, list[str]] = field(default_factory=dict)
    """Those of them its owner lends (`lend`): the only ones given to workloads."""
    revoked: bool = False
    """Its enrolment was revoked: it takes no work and its reports are ignored, for good."""
    tunnel: bool = False
    """Its workloads are reached through the tunnel its agent dialed (from its enrolment)."""
    address: str | None = None
    """Where the control plane reaches a direct machine (from its enrolment): its routes point
    there whatever its agent reports (ADR-0026); None: not enrolled with one."""
    owner_tenant: str | None = None
    """Its owner's tenant (from its enrolment); None: the cell's (`machine_owner_tenant`)."""
    sharing: SharingLevel = SharingLevel.private
    guests: frozenset[str] = frozenset()
    guest_users: frozenset[str] = frozenset()
    """Users (ids) invited to use it, whatever their tenant: theirs count like a guest
    tenant's, while the machine is not private."""
    """Tenants invited to use it (counted while it is not private)."""
    enrolled: bool = False
    """Its enrolment has been read since the book was built: until then who owns it, and who
    else may use it, is unknown (not "nobody"), so no guest is judged there."""
    reclaim_grace_s: float = 120.0
    guest_min_runtime_s: float = 600.0
    enrolment_reclaimed_at: datetime | None = None
    """When its owner reclaimed it through the api (its enrolment); the agent's own reclaim is
    `inventory.reclaimed_at`. Both from the bus, in memory only."""
    lend: Lend | None = None
    """What its owner lends of its inventory (its enrolment; None: all of it)."""

    @property
    def reclaimed_at(self) -> datetime | None:
        """Reclaimed since the earlier of the api's and the agent's reclaim; None: by neither."""
        both = [
            t for t in (self.enrolment_reclaimed_at, self.inventory.reclaimed_at) if t is not None
        ]
        return min(both) if both else None

    @property
    def placeable(self) -> bool:
        return (
            not self.revoked
            and self.liveness is Liveness.alive
            and self.observed_generation >= self.settle_generation
        )

    @property
    def lent_cpus(self) -> float:
        """The cores workloads may have here in total: the inventory's, or fewer if lent so."""
        cpus = float(self.inventory.cpus)
        return cpus if self.lend is None or self.lend.cpus is None else min(cpus, self.lend.cpus)

    @property
    def lent_memory_mib(self) -> int:
        """The memory workloads may have here in total: the inventory's, or less if lent so."""
        memory = self.inventory.memory_mib
        lent = None if self.lend is None else self.lend.memory_mib
        return memory if lent is None else min(memory, lent)

    def lends_gpu(self, uuid: str) -> bool:
        return self.lend is None or self.lend.gpus is None or uuid in self.lend.gpus

    def booked_gpus(self) -> set[str]:
        return {uuid for row in self.rows.values() for uuid in row.gpus}

    def used_cpus(self) -> float:
        return sum(row.cpus for row in self.rows.values())

    def used_memory_mib(self) -> int:
        return sum(row.memory_mib for row in self.rows.values())


@dataclass
class Chain:
    """A workload's fallback chain and how far its current admission has gone (ADR-0022).

    Its targets are the chain resolved step by step (`fallback.targets`): 0 is the class and
    region as asked. `start` is the first target of this region's turn (0, or where a region
    step handed it over), `reached` the furthest target tried so far (`start - 1`: none yet).
    """

    steps: list[FallbackStep]
    after_s: float = 0.0
    asked_region: str = ""
    replica: int = 1
    start: int = 0
    reached: int = -1
    since: datetime | None = None
    """When it began to wait at its first target; the next is tried `after_s` later, and so
    on (its chain's timer)."""
    explained: list[str] = field(default_factory=list)
    """Why each target an earlier region tried had no room."""
    optional: bool = False
    """A `replicas` step let it wait without holding up other workloads."""
    targets: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    """The resolved targets (fallback.targets), cached."""

    def to_json(self) -> str:
        """Its stored form (the `fallback` column)."""
        return json.dumps(
            {
                "steps": [step.model_dump(mode="json", by_alias=True) for step in self.steps],
                "after_s": self.after_s,
                "asked_region": self.asked_region,
                "replica": self.replica,
                "start": self.start,
                "reached": self.reached,
                "since": self.since.isoformat() if self.since else None,
                "explained": self.explained,
                "optional": self.optional,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Chain:
        data = json.loads(text)
        since = data.get("since")
        return cls(
            steps=[FallbackStep.model_validate(step) for step in data["steps"]],
            after_s=float(data.get("after_s", 0.0)),
            asked_region=str(data.get("asked_region", "")),
            replica=int(data.get("replica", 1)),
            start=int(data.get("start", 0)),
            reached=int(data.get("reached", -1)),
            since=datetime.fromisoformat(since) if since else None,
            explained=[str(e) for e in data.get("explained", [])],
            optional=bool(data.get("optional", False)),
        )


@dataclass(eq=False)
class Workload:
    """A workload of this region and where the scheduler has put it.

    `machine_id` is the machine that runs it, ran it, or holds its working directory (so a
    resume can prefer it). `pending_since` orders the queue: oldest first.
    """

    workload_id: str
    tenant_id: str
    region: str
    kind: WorkloadKind
    class_name: str
    count: int
    spec: dict[str, Any]
    state: WorkloadState
    access_token: str
    created_at: datetime
    name: str = ""
    """Its name; an endpoint's is the model name the gateway routes by."""
    user_id: str | None = None
    """The user who launched it: a machine invitation may name a user (trust.py)."""
    reason: str = ""
    machine_id: str | None = None
    seq: int = 0
    pending_since: datetime | None = None
    request_id: str | None = None
    traceparent: str | None = None
    """The trace of the request that last acted on it, while tracing is on: the scheduler's
    decision span, which its events and its place in desired states carry on (in memory; a
    load starts without it)."""
    running_since: datetime | None = None
    """When it last became running (in memory; a load takes the load's time: ADR-0017)."""
    placed_class: str | None = None
    """The class it is placed as: its own, or a fallback step's (None: never placed)."""
    chain: Chain | None = None
    """Its fallback chain (None: it asked for no substitute)."""
    last_asked: tuple[datetime, str] | None = None
    """When the latest park, resume or remove applied to it was asked (the api's clock), and
    which it was (in memory): an earlier one delivered after it is not applied."""
    last_transition_at: datetime | None = None
    """When its last transition was timed (in memory): the next is never timed before it,
    though one is timed back to a lost machine's last heartbeat, read off another clock. A
    note may come between them (a suspect machine's) and is not counted."""

    @property
    def queue_key(self) -> tuple[datetime, str]:
        assert self.pending_since is not None
        return (self.pending_since, self.workload_id)
