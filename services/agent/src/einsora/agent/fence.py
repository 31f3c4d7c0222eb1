"""Fencing: a machine cut off from the control plane stops what may already run elsewhere.

The scheduler declares a silent machine lost after its `lost_after` and may then run some of its
workloads on another machine (ADR-0029). A machine that is only cut off (a partition, a NATS it
cannot reach) would go on running its copy beside the new one. So the agent keeps its own
count: the monotonic seconds since its last exchange the server acknowledged (a put of its
observed state or inventory, the heartbeat the scheduler times it by), never the wall clock,
which may jump. Past `agent_fence_after_s` (90 s by default: shorter than the scheduler's
`lost_after`, 120 s, by more than a stop's grace, 10 s, and a tick), it stops each workload
that the control plane may place elsewhere, before a new copy can start.

Whom it stops is a plain rule over the desired entry (`stops_when_cut_off`): those the
scheduler marked `replaceable` (a fallback chain, an endpoint's replicas), unless the spec says
`disconnect: keep`, and any whose spec says `disconnect: stop`. The others the scheduler fails
and places nowhere else, so stopping them would only lose work.

It needs nothing from the bus to decide: a machine that hears nothing cannot know whether it
was declared lost, and stopping a little early is the safe side of that doubt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from einsora.common.schemas import DesiredWorkload


class Disconnect(StrEnum):
    """A workload's own choice, `spec.disconnect` (Nomad's `disconnect` block, in one word)."""

    stop = "stop"
    """Stop it when its machine is cut off for the fence time, wherever else it may run."""
    keep = "keep"
    """Keep it running while cut off, even if the control plane runs it elsewhere meanwhile."""


def stops_when_cut_off(desired: DesiredWorkload) -> bool:
    """Whether this workload is stopped once its machine is cut off for the fence time: as its
    spec says (`disconnect`), else when the control plane may run it elsewhere."""
    said = desired.spec.get("disconnect")
    if said == Disconnect.stop:
        return True
    if said == Disconnect.keep:
        return False
    return desired.replaceable


def fence_reason(after_s: float) -> str:
    """What the observed state says of a workload its agent stopped so (the timeline shows it)."""
    return (
        f"stopped by its agent after {after_s:g} s without the control plane "
        "(it may run elsewhere now)"
    )


@dataclass
class Contact:
    """When one machine last heard the bus acknowledge one of its writes (monotonic seconds)."""

    fence_after_s: float
    """0: never cut off."""
    last: float = field(default_factory=time.monotonic)
    """A machine starts as just heard from: it could not have started without the bus."""

    def heard(self, at: float | None = None) -> None:
        """The server acknowledged a write sent no earlier than `at` (default: now)."""
        self.last = max(self.last, time.monotonic() if at is None else at)

    def cut_off_for(self, now: float) -> float | None:
        """The seconds without the bus at `now`, once they reach the fence time; else None."""
        if self.fence_after_s <= 0:
            return None
        silent = now - self.last
        return silent if silent >= self.fence_after_s else None
