"""Versioned pydantic schemas of every message on the bus."""

from einsora.common.schemas.access import (
    AccessRedeemReply,
    AccessRedeemRequest,
    Route,
    TokensRevoked,
)
from einsora.common.schemas.base import Message, utcnow, what_is_wrong
from einsora.common.schemas.machine import (
    DesiredState,
    DesiredWorkload,
    Endpoint,
    Gpu,
    GpuHealth,
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    Resources,
    Target,
)
from einsora.common.schemas.workload import (
    TERMINAL_STATES,
    EventKind,
    IntentAction,
    Placement,
    WorkloadEvent,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
)

__all__ = [
    "TERMINAL_STATES",
    "AccessRedeemReply",
    "AccessRedeemRequest",
    "DesiredState",
    "DesiredWorkload",
    "Endpoint",
    "EventKind",
    "Gpu",
    "GpuHealth",
    "IntentAction",
    "Inventory",
    "Message",
    "ObservedPhase",
    "ObservedState",
    "ObservedWorkload",
    "Placement",
    "Resources",
    "Route",
    "Target",
    "TokensRevoked",
    "WorkloadEvent",
    "WorkloadIntent",
    "WorkloadKind",
    "WorkloadState",
    "utcnow",
    "what_is_wrong",
]
