"""Helpers for tests that drive an agent the way the scheduler does (used by the agent's own
tests and by cross-service tests): write desired states, read observed states, watch processes.

It imports no test framework (the agent installs without one); the pytest fixtures that use it
live in the tests' conftest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from einsora.agent.service import AgentService
from einsora.common.bus import names
from einsora.common.schemas import (
    DesiredState,
    DesiredWorkload,
    Gpu,
    Inventory,
    ObservedState,
    ObservedWorkload,
    Target,
    WorkloadKind,
)

WAIT_S = 20.0


@contextlib.contextmanager
def open_directory(prefix: str) -> Iterator[Path]:
    """A temporary directory anyone may enter (as /var/lib is, and as a workload's own user
    must), deleted after."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


DEVICE_REPORT = "devices.json"
DEVICE_REPORTER = r"""
import errno, http.server, json, os
seen = {"env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")},
        "uid": os.getuid(), "nodes": {}}
nodes = os.environ.get("NODES")
for name in sorted(os.listdir(nodes)) if nodes else []:
    try:
        os.close(os.open(os.path.join(nodes, name), os.O_RDONLY))
        seen["nodes"][name] = "opened"
    except OSError as exc:
        seen["nodes"][name] = errno.errorcode.get(exc.errno, str(exc.errno))
with open("devices.tmp", "w") as f:
    json.dump(seen, f)
os.rename("devices.tmp", "devices.json")
address = ("127.0.0.1", int(os.environ["PORT"]))
http.server.HTTPServer(address, http.server.BaseHTTPRequestHandler).serve_forever()
"""
"""An endpoint's program that writes what it sees of GPUs into `devices.json` in its home, then
serves (`readiness: tcp`): the variables that tell it its GPUs, its uid, and for each device
node in `$NODES` whether it could open it: `ENXIO` (let through, and no driver behind it: the
node is a stand-in), `EPERM` (its device cgroup refused it) or `opened`."""
ALLOWED, DENIED = "ENXIO", "EPERM"


def device_nodes(directory: str | os.PathLike[str], gpus: list[Gpu]) -> dict[str, str]:
    """Stand-ins for the device nodes of `gpus` (`nvidia<N>`, `nvidia-cap<N>`), made in
    `directory` with their real numbers and open to all (root only: mknod). No driver answers
    them, so a process that may open one gets ENXIO, and one its cgroup denies gets EPERM.
    Returns each node's name by its `major:minor`."""
    names_by_number: dict[str, str] = {}
    for gpu in gpus:
        for number in gpu.device_numbers:
            major, minor = (int(part) for part in number.split(":"))
            name = f"nvidia{minor}" if major == 195 else f"nvidia-cap{minor}"
            path = os.path.join(directory, name)
            if not os.path.exists(path):
                os.mknod(path, 0o20666, os.makedev(major, minor))
                os.chmod(path, 0o666)  # noqa: S103 (as the real nodes are: the cgroup decides)
            names_by_number[number] = name
    return names_by_number


def device_verdicts(
    gpus: list[Gpu], booked: list[str], names_by_number: dict[str, str]
) -> dict[str, str]:
    """What a workload booked `booked` must see of each node when its device nodes are
    confined: its own GPUs' let through, every other GPU's refused."""
    allowed = {n for g in gpus if g.uuid in booked for n in g.device_numbers}
    return {
        name: ALLOWED if number in allowed else DENIED for number, name in names_by_number.items()
    }


class StartAgent(Protocol):
    """The `start_agent` fixture: start an in-process agent with AgentService's options."""

    async def __call__(self, **options: Any) -> AgentService: ...


@dataclass
class ControlPlane:
    """The test's stand-in for the scheduler: writes desired states, reads observed ones."""

    nc: NATS
    kv: KeyValue

    @staticmethod
    def workload(
        workload_id: str,
        target: Target = Target.running,
        kind: WorkloadKind = WorkloadKind.notebook,
        spec: dict[str, Any] | None = None,
        access_token: str | None = None,
        driver: str | None = None,
    ) -> DesiredWorkload:
        """A desired workload as the scheduler would write it (`driver`: the one it chose)."""
        return DesiredWorkload(
            workload_id=workload_id,
            tenant_id="t-test",
            kind=kind,
            class_name="cpu-1c-2g",
            target=target,
            spec=spec or {},
            access_token=access_token,
            driver=driver,
        )

    async def put_desired(
        self, machine_id: str, generation: int, workloads: list[DesiredWorkload]
    ) -> None:
        desired = DesiredState(machine_id=machine_id, generation=generation, workloads=workloads)
        await self.kv.put(names.desired_key(machine_id), desired.to_bytes())

    async def observed(self, machine_id: str) -> ObservedState | None:
        try:
            entry = await self.kv.get(names.observed_key(machine_id))
        except KeyNotFoundError:
            return None
        return None if entry.value is None else ObservedState.from_bytes(entry.value)

    async def inventory(self, machine_id: str) -> Inventory | None:
        try:
            entry = await self.kv.get(names.inventory_key(machine_id))
        except KeyNotFoundError:
            return None
        return None if entry.value is None else Inventory.from_bytes(entry.value)

    async def wait_observed(
        self,
        machine_id: str,
        check: Callable[[ObservedState], bool],
        within_s: float = WAIT_S,
    ) -> ObservedState:
        """The first observed state of `machine_id` for which `check` holds (polled, deadline)."""
        deadline = time.monotonic() + within_s
        last: ObservedState | None = None
        while time.monotonic() < deadline:
            last = await self.observed(machine_id)
            if last is not None and check(last):
                return last
            await asyncio.sleep(0.05)
        raise AssertionError(f"observed state of {machine_id} never matched; last: {last}")

    async def wait_workload(
        self,
        machine_id: str,
        workload_id: str,
        check: Callable[[ObservedWorkload], bool],
        within_s: float = WAIT_S,
    ) -> ObservedWorkload:
        state = await self.wait_observed(
            machine_id,
            lambda s: any(w.workload_id == workload_id and check(w) for w in s.workloads),
            within_s,
        )
        return next(w for w in state.workloads if w.workload_id == workload_id)

    async def record(self, machine_id: str) -> Callable[[], list[ObservedState]]:
        """Subscribe to every write of `machine_id`'s observed key; returns the list so far."""
        seen: list[ObservedState] = []

        async def on(msg: Msg) -> None:
            if msg.data:
                seen.append(ObservedState.from_bytes(msg.data))

        subject = names.MACHINES.key_subject(names.observed_key(machine_id))
        await self.nc.subscribe(subject, cb=on)
        await self.nc.flush()
        return lambda: list(seen)


class Processes:
    """Processes a test watches; every one still running is killed (with its group) after."""

    def __init__(self) -> None:
        self.tracked: list[psutil.Process] = []

    def track(self, pid: int | None) -> int:
        assert pid is not None
        with contextlib.suppress(psutil.Error):
            self.tracked.append(psutil.Process(pid))
        return pid

    @staticmethod
    def alive(pid: int) -> bool:
        try:
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def kill_all(self) -> None:
        for proc in self.tracked:
            if proc.is_running():  # same pid AND start time: never a recycled pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(psutil.Error):
                    proc.kill()
