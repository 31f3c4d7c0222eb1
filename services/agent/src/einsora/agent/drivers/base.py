"""The one small interface every driver implements: start, observe, stop, adopt.

A driver knows how to run one kind of thing (nothing at all for `sim`, a local process for
`process`, a container for `docker`, a VM for `libvirt`); the supervisor above it decides *when*
to start, park and stop. A driver never talks to the
bus and never decides a workload's target: it only reports what it sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from einsora.common.errors import EinsoraError
from einsora.common.schemas import DesiredWorkload, DeviceAccess, Endpoint, ObservedPhase


class StartFailed(EinsoraError):
    """A workload could not be started; `message` says why in words a person can act on."""

    code = "start_failed"


@dataclass
class Handle:
    """What a driver returns for a workload it started or adopted."""

    workload_id: str
    started_at: datetime
    pid: int | None = None
    endpoint: Endpoint | None = None
    ready: bool = False
    """Its readiness probe has answered since it started. Kept in its record, so a restarted
    agent knows a failed probe is a running workload's (counted, see `supervisor`), not a slow
    start's (bounded by the start timeout)."""
    devices: DeviceAccess | None = None
    """The GPUs its driver gave it and how it holds it to them (reported as observed)."""


@dataclass(frozen=True)
class Observation:
    """A driver's view of one workload now.

    `phase` is `starting` (its readiness probe did not answer: `reason` says why), `running` or
    `failed`; `recheck_s` is when the driver wants to look again (None: nothing will change on its
    own, wait for a new target). A workload that was running and whose probe stops answering is
    `starting` here too: what that means is the supervisor's decision, not the driver's.
    """

    phase: ObservedPhase
    reason: str = ""
    recheck_s: float | None = None


@dataclass(frozen=True)
class Adoption:
    """What a restarted agent found of a workload it had started: a handle, or why none."""

    handle: Handle | None
    reason: str = ""


class Driver(Protocol):
    """Runs workloads of one kind on this machine."""

    name: str

    async def start(self, workload: DesiredWorkload, workdir: Path | None) -> Handle:
        """Start `workload` (raises StartFailed with the reason)."""
        ...

    async def observe(self, handle: Handle) -> Observation:
        """Whether the workload is starting, running (its readiness probe answers) or failed."""
        ...

    async def stop(self, handle: Handle, grace_s: float) -> None:
        """Stop it: a polite request, then force after `grace_s`. Idempotent."""
        ...

    async def park(self, handle: Handle, grace_s: float) -> str:
        """Stop it keeping what a resume needs (a VM's memory too, where it can), and say how
        in words for the timeline ("" when there is nothing more to say than "parked")."""
        ...

    def record(self, handle: Handle) -> dict[str, Any] | None:
        """What to persist so a restarted agent can adopt it (None: nothing survives a restart)."""
        ...

    async def adopt(self, record: dict[str, Any]) -> Adoption:
        """The workload of `record`, still running, or why it cannot be adopted."""
        ...

    async def delete(self, workdir: Path) -> None:
        """Delete a stopped workload's files: `workdir` last (raises OSError)."""
        ...


@runtime_checkable
class Discovers(Protocol):
    """A driver whose engine knows the workloads it runs (a domain's name, a container's
    label), so a restarted agent finds them even without their records."""

    name: str

    async def discover(self, machine_id: str) -> dict[str, dict[str, Any]]:
        """Records (as `record` makes them) of this machine's running workloads, by id."""
        ...
