"""The `process` driver: a workload is a real local process in its own working directory.

A notebook is a Jupyter server, an endpoint its `spec.command`; each runs in
`<data_dir>/workloads/<id>/`, in a session of its own, its output in `logs/`. What a restarted
agent needs to find it again (pid, start time, port, probe) is its `record`; a process is
adopted only when both pid and start time still match.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from einsora.agent.drivers import launch, spawn
from einsora.agent.drivers.base import Adoption, Handle, Observation, StartFailed
from einsora.agent.drivers.probe import Probe, check
from einsora.common.schemas import DesiredWorkload, Endpoint, ObservedPhase, utcnow


@dataclass(frozen=True)
class ProcessOptions:
    """Timing of the process driver."""

    python: str = sys.executable
    """The Python that runs Jupyter for notebooks (it needs the agent's `notebook` extra)."""
    poll_s: float = 1.0
    """How often a running workload is looked at (process alive, probe answering)."""
    starting_poll_s: float = 0.25
    """How often a starting workload's probe is tried."""


@dataclass
class ProcessHandle(Handle):
    """A workload process: identified by pid and start time, found through its probe."""

    create_time: float = 0.0
    probe: Probe | None = None
    workdir: str = ""
    child: bool = False
    """Started by this agent run (so its exit code can be read); False once adopted."""


class ProcessDriver:
    """Runs notebooks and endpoints as local processes."""

    name = "process"

    def __init__(self, options: ProcessOptions | None = None) -> None:
        self.options = options or ProcessOptions()

    async def start(self, workload: DesiredWorkload, workdir: Path | None) -> Handle:
        if workdir is None:
            raise StartFailed("the process driver needs a working directory")
        dirs = launch.WorkloadDirs(workdir)
        try:
            dirs.create()
            plan = launch.plan(workload, dirs, self.options.python)
            header = f"{spawn.LOG_MARKER}{utcnow().isoformat()} ==\n"
            for log in (dirs.stdout, dirs.stderr):
                with log.open("a") as f:
                    f.write(header)
            spawned = spawn.spawn(
                plan.argv, cwd=plan.cwd, env=plan.env, stdout=dirs.stdout, stderr=dirs.stderr
            )
        except OSError as exc:
            raise StartFailed(f"could not start its process: {exc}") from exc
        return ProcessHandle(
            workload_id=workload.workload_id,
            started_at=utcnow(),
            pid=spawned.pid,
            endpoint=Endpoint(host=plan.probe.host, port=plan.port),
            create_time=spawned.create_time,
            probe=plan.probe,
            workdir=str(workdir),
            child=True,
        )

    async def observe(self, handle: Handle) -> Observation:
        assert isinstance(handle, ProcessHandle)
        assert handle.pid is not None
        ended, code = self._ended(handle)
        if ended:
            return Observation(ObservedPhase.failed, self.exit_reason(handle, code))
        ready = handle.probe is None or await check(handle.probe)
        if ready:
            return Observation(ObservedPhase.running, recheck_s=self.options.poll_s)
        return Observation(ObservedPhase.starting, recheck_s=self.options.starting_poll_s)

    async def stop(self, handle: Handle, grace_s: float) -> None:
        assert isinstance(handle, ProcessHandle)
        assert handle.pid is not None
        await spawn.terminate(handle.pid, handle.create_time, child=handle.child, grace_s=grace_s)

    def record(self, handle: Handle) -> dict[str, Any] | None:
        assert isinstance(handle, ProcessHandle)
        return {
            "workload_id": handle.workload_id,
            "pid": handle.pid,
            "create_time": handle.create_time,
            "started_at": handle.started_at.isoformat(),
            "endpoint": None if handle.endpoint is None else handle.endpoint.model_dump(),
            "probe": None if handle.probe is None else handle.probe.to_dict(),
            "workdir": handle.workdir,
        }

    async def adopt(self, record: dict[str, Any]) -> Adoption:
        try:
            handle = ProcessHandle(
                workload_id=str(record["workload_id"]),
                started_at=datetime.fromisoformat(record["started_at"]),
                pid=int(record["pid"]),
                endpoint=None if record.get("endpoint") is None else Endpoint(**record["endpoint"]),
                create_time=float(record["create_time"]),
                probe=None if record.get("probe") is None else Probe.from_dict(record["probe"]),
                workdir=str(record.get("workdir", "")),
                child=False,
            )
        except (KeyError, TypeError, ValueError) as exc:
            return Adoption(None, f"its record could not be read ({exc})")
        assert handle.pid is not None
        alive = await asyncio.to_thread(spawn.same_process, handle.pid, handle.create_time)
        if alive is None:
            return Adoption(
                None,
                f"its process (pid {handle.pid}) ended while the agent was not running"
                + self._tail(handle),
            )
        return Adoption(handle)

    def _ended(self, handle: ProcessHandle) -> tuple[bool, int | None]:
        assert handle.pid is not None
        if handle.child:
            state = spawn.reap(handle.pid)
            if state == spawn.RUNNING:
                return False, None
            return True, state if isinstance(state, int) else None
        return spawn.same_process(handle.pid, handle.create_time) is None, None

    def exit_reason(self, handle: ProcessHandle, code: int | None) -> str:
        return spawn.describe_exit(code) + self._tail(handle)

    @staticmethod
    def _tail(handle: ProcessHandle) -> str:
        if not handle.workdir:
            return ""
        dirs = launch.WorkloadDirs(Path(handle.workdir))
        for log in (dirs.stderr, dirs.stdout):
            tail = spawn.log_tail(log)
            if tail:
                return f"; last lines of logs/{log.name}: {tail}"
        return ""
