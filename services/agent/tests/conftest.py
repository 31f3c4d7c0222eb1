"""Fixtures for the agent's tests: the test plays the scheduler on a real NATS server.

It writes machines' desired states into the `machines` bucket and reads what the agent observed,
exactly as the scheduler does; the agent under test is the real one (in-process, or a subprocess
where a crash is tested). Every process a test starts is killed in teardown.

A root agent runs workloads as users of their own (ADR-0007), who cannot run a Python that lives
in a private home (under /root, say): `workload_python` is one they can.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from einsora.agent import workload_python as workload_python_module
from einsora.agent.service import AgentService
from einsora.agent.workload_python import WorkloadPython
from einsora.common.bus import bind_bucket, names
from einsora.common.settings import Settings
from einsora.common.testing import Bus
from einsora.testing.agent import ControlPlane, Processes, StartAgent


@pytest_asyncio.fixture
async def control(bus: Bus) -> ControlPlane:
    return ControlPlane(bus.nc, bind_bucket(bus.js, names.MACHINES))


def settings_for(bus: Bus, data_dir: Path) -> Settings:
    return Settings(nats_url=bus.url, data_dir=data_dir, region="local")


@pytest_asyncio.fixture
async def start_agent(bus: Bus, data_dir: Path) -> AsyncIterator[StartAgent]:
    """Start an in-process agent (`await start_agent(driver="sim", ...)`); all stopped after,
    their workloads too."""
    started: list[AgentService] = []

    async def start(**options: Any) -> AgentService:
        """`settings`: overrides of the agent's Settings (e.g. `gpu_inventory`)."""
        options.setdefault("heartbeat_s", 1.0)
        options.setdefault("poll_s", 0.2)
        options.setdefault("grace_s", 3.0)
        settings = settings_for(bus, options.pop("data_dir", data_dir))
        settings = settings.model_copy(update=options.pop("settings", {}))
        service = AgentService(settings, **options)
        await service.start()
        started.append(service)
        return service

    yield start
    for service in reversed(started):
        await service.stop_workloads()
        await service.stop()


@pytest.fixture
def processes() -> Iterator[Processes]:
    tracked = Processes()
    yield tracked
    tracked.kill_all()


@pytest.fixture(scope="session")
def workload_python() -> Iterator[WorkloadPython]:
    """A Python the agent's workloads can run (see `einsora.agent.workload_python`); the test
    is skipped, saying why, where there is none."""
    scratch = Path(tempfile.mkdtemp(prefix="einsora-python-"))
    scratch.chmod(0o755)  # a wrapper in it must be reachable by every workload's user
    try:
        found = workload_python_module.find(scratch)
        if isinstance(found, str):
            pytest.skip(found)
        yield found
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
