"""A region's scheduler, as it tells the others: alive or not, and what it has free.

Each region's scheduler puts `regions/<region>` every `period_s` seconds (ADR-0022): the api
lists it in `GET /v1/regions` and says when a launch waits for a scheduler that is down; the
other regions' schedulers take a region step only to a region whose scheduler is up, and an
endpoint's model fallback is the gateway's own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import Field

from einsora.common.schemas.base import Message

SILENT_PERIODS = 3
"""A scheduler silent this many periods (and a few seconds more) is taken for down."""
SLACK_S = 5.0
"""Added to the silence allowed: control-plane clocks differ by a little, never by minutes."""


class SchedulerState(StrEnum):
    """What a scheduler said of itself last."""

    up = "up"
    stopped = "stopped"
    """It stopped cleanly (SIGTERM); a scheduler killed says nothing and goes silent."""


class RegionStatus(Message):
    """`regions/<region>`: one region's scheduler and its free capacity."""

    region: str
    state: SchedulerState = SchedulerState.up
    at: datetime
    """When it was written, on the writing scheduler's clock."""
    period_s: float = Field(gt=0)
    """How often it is written while the scheduler runs."""
    machines: int = Field(default=0, ge=0)
    """The region's machines that can take work now (enrolled, reporting, settled)."""
    free: dict[str, int] = Field(default_factory=dict)
    """By class: free devices of a GPU class; for a CPU class, how many of it would fit."""
    queued: int = Field(default=0, ge=0)
    """Workloads waiting for room in the region."""

    def down_since(self, now: datetime) -> datetime | None:
        """None while its scheduler is up; else when it was last heard of."""
        if self.state is SchedulerState.stopped:
            return self.at
        allowed = timedelta(seconds=self.period_s * SILENT_PERIODS + SLACK_S)
        return self.at if now - self.at > allowed else None

    def why_down(self, now: datetime) -> str | None:
        """The sentence for a timeline or a listing when its scheduler is down; None if up."""
        since = self.down_since(now)
        if since is None:
            return None
        how = "stopped" if self.state is SchedulerState.stopped else "not reporting"
        return f"region {self.region}'s scheduler is {how} (last heard of at {since:%H:%M:%S} UTC)"
