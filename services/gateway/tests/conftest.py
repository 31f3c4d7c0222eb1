"""Fixtures: a real gateway on the session's nats-server, real sim endpoints as its upstreams.

Every test gets a tenant of its own (its models, keys and usage messages are its own) and a
harness (`einsora.gateway.testing`) that writes keys and routes as the api and scheduler do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from einsora.agent.runtimes.sim_server import SimEndpointServer
from einsora.common.schemas import SimEndpoint
from einsora.common.testing import Bus
from einsora.gateway.testing import PINNED_NOW, Harness, StartUpstream, Upstream, harness


async def start_sim(model: str, options: SimEndpoint | None) -> Upstream:
    server = SimEndpointServer(model, options)
    await server.start()
    return server


@pytest.fixture
def start_upstream() -> StartUpstream:
    """What starts a test's upstreams: the agent's sim endpoint."""
    return start_sim


@pytest_asyncio.fixture(name="harness")
async def pinned_harness(bus: Bus, data_dir: Path) -> AsyncIterator[Harness]:
    """A gateway whose clock is pinned mid-minute (its rate-limit window never rolls over)."""
    async with harness(bus.js, bus.url, data_dir, start_sim, lambda: PINNED_NOW) as made:
        yield made


@pytest_asyncio.fixture
async def real_clock_harness(bus: Bus, data_dir: Path) -> AsyncIterator[Harness]:
    """A gateway on the real clock, for tests that share limits with another process."""
    async with harness(bus.js, bus.url, data_dir, start_sim, None) as made:
        yield made
