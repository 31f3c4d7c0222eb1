"""Fixtures for the agent's tests: the test plays the scheduler on a real NATS server.

It writes machines' desired states into the `machines` bucket and reads what the agent observed,
exactly as the scheduler does; the agent under test is the real one (in-process, or a subprocess
where a crash is tested). Every process a test starts is killed in teardown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from einsora.agent import AgentService
from einsora.agent.testing import ControlPlane, Processes, StartAgent
from einsora.common.bus import bind_bucket, names
from einsora.common.settings import Settings
from einsora.common.testing import Bus


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
        options.setdefault("heartbeat_s", 1.0)
        options.setdefault("poll_s", 0.2)
        options.setdefault("grace_s", 3.0)
        service = AgentService(settings_for(bus, options.pop("data_dir", data_dir)), **options)
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
