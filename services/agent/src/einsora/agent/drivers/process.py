"""The `process` driver: a workload is a real local process in its own working directory.

A notebook is a Jupyter server, an endpoint its runtime's server (llama.cpp, vLLM, MLX, or its
`spec.command`) over a checked model file (`launch.prepare`); each runs in
`<data_dir>/workloads/<id>/`, in a session of its own, its output in `logs/`. What a restarted
agent needs to find it again (pid, start time, port, probe, uid) is its `record`; a process is
adopted only when both pid and start time still match.

When the agent runs as root, each workload runs as an unprivileged user of its own, with its
files in a private directory outside the data dir (`isolation`, ADR-0007); otherwise it runs as
the agent's user, its files in its working directory.

Every workload sees exactly the GPUs it was booked (none when it was booked none), told by its
environment; where the agent runs as root on a machine with NVIDIA GPUs, its device nodes are
confined to those GPUs' by a cgroup of its own (`devices`, ADR-0025). Its handle, its record and
so its observed state say what it was given and how it is held to it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from einsora.agent.drivers import devices, isolation, launch, spawn
from einsora.agent.drivers.base import Adoption, Handle, Observation, StartFailed
from einsora.agent.drivers.probe import PROBE_TIMEOUT_S, Probe, failure
from einsora.common.schemas import (
    DesiredWorkload,
    DeviceAccess,
    Endpoint,
    Gpu,
    ObservedPhase,
    WorkloadKind,
    utcnow,
)

if TYPE_CHECKING:  # a module that imports the drivers
    from einsora.agent.downloads import DownloadPolicy

RELEASE_TRIES = 20
"""How often a stopped workload's device cgroup is tried for removal, 50 ms apart (its last
processes may take a moment to leave it)."""


def _is_root() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True)
class ProcessOptions:
    """Timing and isolation of the process driver."""

    python: str = sys.executable
    """The Python that runs Jupyter for notebooks (it needs the agent's `notebook` extra)."""
    poll_s: float = 1.0
    """How often a running workload is looked at (process alive, probe answering)."""
    starting_poll_s: float = 0.25
    """How often a starting workload's probe is tried."""
    probe_timeout_s: float = PROBE_TIMEOUT_S
    """How long a workload has to answer one readiness probe."""
    unprivileged: bool = field(default_factory=_is_root)
    """Run each workload as a user of its own (ADR-0007): what a root agent does."""
    homes: Path = isolation.WORKLOAD_HOMES
    """Where the private directories of those workloads live (with the machine's book of uids)."""
    gpus: Callable[[], list[Gpu]] | None = None
    """This machine's GPUs as its inventory lists them (their uuids and device nodes); None:
    not known to the driver, so booked GPUs are not checked against them."""
    downloads: DownloadPolicy | None = None
    """What an endpoint's model download may reach and bring (the machine owner's settings);
    None: public addresses only, within the default cap."""


@dataclass
class ProcessHandle(Handle):
    """A workload process: identified by pid and start time, found through its probe."""

    create_time: float = 0.0
    probe: Probe | None = None
    workdir: str = ""
    child: bool = False
    """Started by this agent run (so its exit code can be read); False once adopted."""
    uid: int | None = None
    """The user of its own it runs as (None: the agent's user)."""
    cgroup: str | None = None
    """Its device cgroup (None: its device nodes are not confined)."""


class ProcessDriver:
    """Runs notebooks and endpoints as local processes."""

    name = "process"

    def __init__(self, options: ProcessOptions | None = None) -> None:
        self.options = options or ProcessOptions()
        self.uids = isolation.UidBook(self.options.homes)
        self.confiner = (
            devices.Confiner.probe()
            if self.options.unprivileged
            else devices.Confiner(
                note="the agent does not run as root, so its workloads run as its own user and "
                "their device nodes are not confined"
            )
        )
        """How this machine confines workloads' device nodes (the inventory reports it)."""

    def private_dir(self, workdir: Path) -> Path:
        """Where the workload of `workdir` keeps its own files (`home/`, `jupyter/`): its
        private directory when it has a user of its own, else `workdir` itself."""
        uid = isolation.uid_of(workdir) if self.options.unprivileged else None
        return workdir if uid is None else self.uids.homes / str(uid)

    async def start(self, workload: DesiredWorkload, workdir: Path | None) -> Handle:
        if workdir is None:
            raise StartFailed("the process driver needs a working directory")
        cgroup: Path | None = None
        try:
            user = None
            if self.options.unprivileged:
                user = await asyncio.to_thread(self.uids.claim, workdir)
            dirs = launch.WorkloadDirs(workdir, None if user is None else user.home)
            dirs.create()
            plan = await launch.prepare(workload, dirs, self.options.python, self.options.downloads)
            booked = self._booked(workload)
            if user is not None:
                self._check_isolated(workload, plan, workdir, user)
                cgroup = await self._confine(workload.workload_id, booked)
            header = f"{spawn.LOG_MARKER}{utcnow().isoformat()} ==\n"
            for log in (dirs.stdout, dirs.stderr):
                with log.open("a") as f:
                    f.write(header)
            if user is None:
                spawned = spawn.spawn(
                    plan.argv, cwd=plan.cwd, env=plan.env, stdout=dirs.stdout, stderr=dirs.stderr
                )
            else:
                launch.write_secret(dirs.launch_file, _launch_file(plan, dirs, user, cgroup))
                spawned = spawn.spawn_as(dirs.launch_file, stdout=dirs.stdout, stderr=dirs.stderr)
        except OSError as exc:
            if cgroup is not None:
                await _release(cgroup)
            raise StartFailed(f"could not start its process: {exc}") from exc
        confined = None if cgroup is None else self.confiner.method
        return ProcessHandle(
            workload_id=workload.workload_id,
            started_at=utcnow(),
            pid=spawned.pid,
            endpoint=Endpoint(host=plan.probe.host, port=plan.port, runtime=plan.runtime),
            create_time=spawned.create_time,
            probe=plan.probe,
            workdir=str(workdir),
            child=True,
            uid=None if user is None else user.uid,
            devices=DeviceAccess(gpus=booked, confinement=confined),
            cgroup=None if cgroup is None else str(cgroup),
        )

    def _booked(self, workload: DesiredWorkload) -> list[str]:
        """Its booked GPUs, each checked against this machine's (StartFailed naming one that
        is not here: the scheduler booked from an inventory that has changed since)."""
        booked = list(workload.resources.gpus)
        if self.options.gpus is None:
            return booked
        here = {g.uuid: g for g in self.options.gpus()}
        for uuid in booked:
            gpu = here.get(uuid)
            if gpu is None:
                raise StartFailed(f"GPU {uuid} is not on this machine (its inventory changed)")
            if gpu.mig_mode:
                raise StartFailed(
                    f"GPU {uuid} is in MIG mode: only its slices are given out, never the GPU whole"
                )
        return booked

    def _machine_gpus(self) -> list[Gpu]:
        return [] if self.options.gpus is None else self.options.gpus()

    async def _confine(self, workload_id: str, booked: list[str]) -> Path | None:
        """Its device cgroup, where this machine has GPUs and can confine (None otherwise)."""
        gpus = self._machine_gpus()
        if self.confiner.method is None or not (gpus or devices.has_nvidia_nodes()):
            return None
        rules = devices.DeviceRules.of(gpus, booked)
        try:
            return await asyncio.to_thread(self.confiner.confine, workload_id, rules)
        except OSError as exc:
            raise StartFailed(
                f"its device nodes could not be confined to its GPUs "
                f"({self.confiner.method.value}): {exc.strerror or exc}; not started"
            ) from exc

    def _check_isolated(
        self,
        workload: DesiredWorkload,
        plan: launch.LaunchPlan,
        workdir: Path,
        user: isolation.WorkloadUser,
    ) -> None:
        """StartFailed, naming the path, for what the workload's user would not get past (its
        program, Jupyter) or should not (the agent's data dir)."""
        isolation.check_closed(workdir.parent.parent, user)
        isolation.check_can_run(plan.argv[0], plan.env.get("PATH"), user)
        same_python = os.path.realpath(self.options.python) == os.path.realpath(sys.executable)
        package = launch.jupyter_server_dir()
        if workload.kind is WorkloadKind.notebook and same_python and package is not None:
            isolation.check_can_read("jupyter-server, installed at", package, user)
        if plan.model is not None:
            isolation.check_can_read_model(plan.model, user)

    async def observe(self, handle: Handle) -> Observation:
        assert isinstance(handle, ProcessHandle)
        assert handle.pid is not None
        ended, code = self._ended(handle)
        if ended:
            return Observation(ObservedPhase.failed, self.exit_reason(handle, code))
        why = None
        if handle.probe is not None:
            why = await failure(handle.probe, self.options.probe_timeout_s)
        if why is None:
            return Observation(ObservedPhase.running, recheck_s=self.options.poll_s)
        return Observation(ObservedPhase.starting, why, recheck_s=self.options.starting_poll_s)

    async def stop(self, handle: Handle, grace_s: float) -> None:
        assert isinstance(handle, ProcessHandle)
        assert handle.pid is not None
        await spawn.terminate(handle.pid, handle.create_time, child=handle.child, grace_s=grace_s)
        if handle.uid is not None:  # its uid is its alone: whatever still runs as it is its own
            await asyncio.to_thread(isolation.kill_all_of, handle.uid)
        if handle.cgroup is not None:
            await _release(Path(handle.cgroup))

    async def park(self, handle: Handle, grace_s: float) -> str:
        await self.stop(handle, grace_s)
        return ""

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
            "uid": handle.uid,
            "ready": handle.ready,
            "devices": None if handle.devices is None else handle.devices.model_dump(mode="json"),
            "cgroup": handle.cgroup,
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
                uid=None if record.get("uid") is None else int(record["uid"]),
                ready=record.get("ready") is True,
                devices=None
                if record.get("devices") is None
                else DeviceAccess.model_validate(record["devices"]),
                cgroup=None if record.get("cgroup") is None else str(record["cgroup"]),
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
        try:
            uid = alive.uids().real
        except psutil.Error:
            uid = None
        if handle.uid is not None and uid != handle.uid:
            return Adoption(
                None, f"its process (pid {handle.pid}) runs as uid {uid}, not its own {handle.uid}"
            )
        if handle.cgroup is not None and handle.devices is not None:
            # Say only the confinement that still holds: its cgroup, with it inside.
            cgroup = Path(handle.cgroup)
            if not await asyncio.to_thread(devices.Confiner.holds, cgroup, handle.pid):
                handle.devices = handle.devices.model_copy(update={"confinement": None})
        return Adoption(handle)

    async def delete(self, workdir: Path) -> None:
        await asyncio.to_thread(self._delete, workdir)

    def _delete(self, workdir: Path) -> None:
        if self.options.unprivileged:
            try:
                self.uids.release(workdir)
            except StartFailed as exc:
                raise OSError(exc.message) from exc
        shutil.rmtree(workdir)

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


async def _release(cgroup: Path) -> None:
    """Remove a stopped workload's device cgroup, once its last processes have left it."""
    for _ in range(RELEASE_TRIES - 1):
        try:
            procs = await asyncio.to_thread((cgroup / "cgroup.procs").read_text)
        except OSError:
            break  # gone already, or unreadable: the removal below says which
        if not procs.strip():
            break
        await asyncio.sleep(0.05)
    await asyncio.to_thread(devices.Confiner.release, cgroup)


def _launch_file(
    plan: launch.LaunchPlan,
    dirs: launch.WorkloadDirs,
    user: isolation.WorkloadUser,
    cgroup: Path | None = None,
) -> str:
    """What `runas` needs, as JSON: it holds the workload's environment, so it stays 0600."""
    return json.dumps(
        {
            "uid": user.uid,
            "gid": user.gid,
            "cgroup": None if cgroup is None else str(cgroup / "cgroup.procs"),
            "dirs": [str(p) for p in plan.own_dirs],
            "token_from": None if plan.token_copy is None else str(dirs.probe_token_file),
            "token_to": None if plan.token_copy is None else str(plan.token_copy),
            "cwd": str(plan.cwd),
            "argv": plan.argv,
            "env": plan.env,
        }
    )
