"""The `sim` driver: runs nothing, reports what a real driver would, on a timetable.

It exists for development, tests and benchmarks (one agent process can host a thousand sim
machines), so it must cost next to nothing per workload: no process, no file, no timer once a
workload is running. Its timing and failures are set by the driver's options or per workload by
the spec's `sim` object: `{"start_delay_s": 0.5, "fail": "out of memory", "fail_after_s": 2}`.

An endpoint is the one exception: whatever its runtime, it is simulated by a real in-process
OpenAI-compatible server (`SimEndpointServer`), so the gateway has something to talk to. No
model file is read; `spec.sim` also sets how the model behaves (`SimEndpoint`: latency, tokens
per second, failures).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from einsora.agent.drivers.base import Adoption, Handle, Observation, StartFailed
from einsora.agent.runtimes import plans
from einsora.agent.runtimes.sim_server import SimEndpointServer
from einsora.common.schemas import (
    Confinement,
    DesiredWorkload,
    DeviceAccess,
    Endpoint,
    ObservedPhase,
    SimEndpoint,
    WorkloadKind,
    utcnow,
)

SIM_HOST = "127.0.0.1"


@dataclass(frozen=True)
class SimOptions:
    """How sim workloads behave unless their spec says otherwise."""

    start_delay_s: float = 0.0
    fail_rate: float = 0.0
    """The share of starts that fail (0 to 1), for benchmarks of the failure path."""
    seed: int | None = None


@dataclass
class SimHandle(Handle):
    """A sim workload: when it becomes ready, and when and why it fails, if it does."""

    ready_at: float = 0.0
    fail_at: float | None = None
    fail_reason: str = ""
    server: SimEndpointServer | None = None
    """An endpoint's simulated model server."""


def _seconds(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise StartFailed(f"spec.sim.{field} must be a number of seconds ≥ 0, not {value!r}")
    return float(value)


class SimDriver:
    """Pretends to run workloads; nothing survives an agent restart."""

    name = "sim"

    def __init__(self, options: SimOptions | None = None) -> None:
        self.options = options or SimOptions()
        self._random = random.Random(self.options.seed)

    async def start(self, workload: DesiredWorkload, workdir: Path | None) -> Handle:
        sim = workload.spec.get("sim", {})
        if not isinstance(sim, dict):
            raise StartFailed(f"spec.sim must be an object, not {type(sim).__name__}")
        delay = _seconds(sim.get("start_delay_s", self.options.start_delay_s), "start_delay_s")
        now = time.monotonic()
        # What a real driver would give it: its booked GPUs, and none besides.
        devices = DeviceAccess(gpus=workload.resources.gpus, confinement=Confinement.sim)
        handle = SimHandle(
            workload_id=workload.workload_id,
            started_at=utcnow(),
            ready_at=now + delay,
            devices=devices,
        )
        fail = sim.get("fail")
        if fail is not None:
            handle.fail_reason = str(fail) or "failed (sim)"
            handle.fail_at = now + _seconds(sim.get("fail_after_s", delay), "fail_after_s")
        elif self.options.fail_rate and self._random.random() < self.options.fail_rate:
            handle.fail_reason = "injected failure (sim fail_rate)"
            handle.fail_at = handle.ready_at
        if workload.kind is WorkloadKind.endpoint:
            await self._serve(workload, sim, handle)
        return handle

    async def _serve(
        self, workload: DesiredWorkload, sim: dict[str, Any], handle: SimHandle
    ) -> None:
        plans.read_spec(workload.spec)  # the same spec a real runtime would be refused for
        try:
            options = SimEndpoint.model_validate(sim)
        except ValidationError as exc:
            raise StartFailed(plans.spec_problem(exc, "spec.sim")) from exc
        server = SimEndpointServer(workload.name or workload.workload_id, options, host=SIM_HOST)
        try:
            port = await server.start()
        except OSError as exc:
            raise StartFailed(f"the sim endpoint could not listen on {SIM_HOST}: {exc}") from exc
        handle.server = server
        handle.endpoint = Endpoint(host=SIM_HOST, port=port, runtime="sim")

    async def observe(self, handle: Handle) -> Observation:
        assert isinstance(handle, SimHandle)
        now = time.monotonic()
        if handle.fail_at is not None and now >= handle.fail_at:
            if handle.server is not None:  # a failed endpoint answers no more
                await handle.server.stop()
            return Observation(ObservedPhase.failed, handle.fail_reason)
        if now < handle.ready_at:
            wake = (
                handle.ready_at if handle.fail_at is None else min(handle.ready_at, handle.fail_at)
            )
            return Observation(ObservedPhase.starting, recheck_s=wake - now)
        if handle.fail_at is not None:
            return Observation(ObservedPhase.running, recheck_s=handle.fail_at - now)
        return Observation(ObservedPhase.running)

    async def stop(self, handle: Handle, grace_s: float) -> None:
        assert isinstance(handle, SimHandle)
        if handle.server is not None:
            await handle.server.stop()

    async def park(self, handle: Handle, grace_s: float) -> str:
        await self.stop(handle, grace_s)
        return ""

    def record(self, handle: Handle) -> dict[str, Any] | None:
        return None

    async def adopt(self, record: dict[str, Any]) -> Adoption:
        return Adoption(None, "the sim driver keeps nothing across restarts")

    async def delete(self, workdir: Path) -> None:
        return None  # it made no files
