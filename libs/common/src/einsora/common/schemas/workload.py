"""Workload messages: what a user asked for (intent) and what happened (events).

States and their order are DESIGN.md's: pending → queued → scheduled → starting → running →
parking → parked → (resume) pending; removing → removed; failed from starting or running.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from einsora.common.schemas.base import Message, utcnow
from einsora.common.schemas.fallback import (
    MAX_FALLBACK_AFTER_S,
    MAX_STEPS,
    FallbackStep,
    Handover,
    steps_of,
)
from einsora.common.vocab import WorkloadKind, WorkloadState

TERMINAL_STATES = frozenset({WorkloadState.removed})
"""States a workload never leaves."""


class IntentAction(StrEnum):
    """What an intent asks the scheduler to do."""

    create = "create"
    park = "park"
    resume = "resume"
    remove = "remove"


class WorkloadIntent(Message):
    """`intent.<region>.workload.<id>`: one thing a user asked of one workload.

    `intent_id` is unique per intent and is its `Nats-Msg-Id`, so a republished outbox row is
    dropped by JetStream and ignored by the scheduler.
    """

    intent_id: str
    action: IntentAction
    workload_id: str
    tenant_id: str
    region: str
    kind: WorkloadKind
    name: str = ""
    """The workload's name; an endpoint's is its model name (the gateway routes by it)."""
    user_id: str | None = None
    """The user who launched it (a machine invitation may name a user, not a tenant: the
    scheduler decides such a guest's trust by it). None in intents from before."""
    class_name: str = Field(alias="class")
    count: int = Field(default=1, ge=1)
    spec: dict[str, Any] = Field(default_factory=dict)
    fallback: Annotated[list[FallbackStep], BeforeValidator(steps_of)] = Field(
        default_factory=list, max_length=MAX_STEPS
    )
    """Its opt-in substitutes, in order (ADR-0022)."""
    fallback_after_s: float = Field(default=0.0, ge=0, le=MAX_FALLBACK_AFTER_S)
    """How long it stays queued at one step before the next is tried."""
    replica: int = Field(default=1, ge=1)
    """Which of its endpoint's replicas it is (1: the endpoint itself; a `replicas` step
    lets those past its number stop holding up others)."""
    handover: Handover | None = None
    """Set on a create that a region step republished to this region (ADR-0022)."""
    forwarded: int = Field(default=0, ge=0)
    """How many schedulers passed this intent on to the region that now holds the workload."""
    at: datetime = Field(default_factory=utcnow)


class EventKind(StrEnum):
    """A timeline entry changes the state (transition) or records a decision (note)."""

    transition = "transition"
    note = "note"


class Placement(Message):
    """Where a workload actually runs."""

    region: str
    machine: str
    placed_class: str


class Metered(Message):
    """What accounting meters of a placed workload, carried by each of its transitions."""

    kind: WorkloadKind
    class_name: str
    placed_class: str
    region: str
    machine: str
    gpus: list[str] = Field(default_factory=list)
    """The GPUs' uuids (their count is the GPUs metered)."""
    cpus: float = 0
    memory_mib: int = 0


class WorkloadEvent(Message):
    """`event.workload.<id>`: one timeline entry, published by the scheduler.

    `event_id` is unique, the `Nats-Msg-Id` of its publish and the key that makes consuming it
    idempotent. `seq` orders a workload's events (the scheduler's own counter), so a reader can
    ignore an event older than the state it already holds.
    """

    event_id: str
    workload_id: str
    tenant_id: str
    kind: EventKind
    state: WorkloadState
    reason: str
    seq: int = Field(ge=0)
    at: datetime = Field(default_factory=utcnow)
    placement: Placement | None = None
    request_id: str | None = None
    region: str | None = None
    """The region whose scheduler holds the workload after this event: its own, or for a
    region step's note the next region's (the api sends later intents there). None from
    schedulers before ADR-0022."""
    metered: Metered | None = None
    """On a transition of a placed workload: what it holds, for accounting. `at` is then the
    moment the change happened on the control plane's clock: when the agent's report of it was
    received (never the agent's own clock), and for a lost machine its last heartbeat."""
