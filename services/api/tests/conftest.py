"""Fixtures: a real api (uvicorn on a free port) over a real store and a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from einsora.api.testing import RunningApi, running_api
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.settings import Settings
from einsora.common.testing import Bus


def settings_for(nats_url: str, database_url: str, data_dir: Path) -> Settings:
    # Tests' machines join from this host, reached directly (no tunnel hub runs here): the
    # operator of this test cell allows loopback for tenant admins' direct machines (ADR-0026).
    return Settings(
        nats_url=nats_url,
        database_url=database_url,
        data_dir=data_dir,
        region="local",
        direct_machine_networks="127.0.0.0/8,::1/128",
    )


@pytest_asyncio.fixture
async def api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api on SQLite and the session's nats-server (streams purged)."""
    async with running_api(settings_for(bus.url, sqlite_url, data_dir)) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def shared_api(
    nats_server: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningApi]:
    """One api for a whole module of tests that only read or are refused (faster)."""
    tmp = tmp_path_factory.mktemp("api")
    settings = settings_for(nats_server.url, f"sqlite+aiosqlite:///{tmp / 'api.db'}", tmp)
    async with running_api(settings) as running:
        yield running


@pytest_asyncio.fixture
async def api_on_store(bus: Bus, store_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api on each engine (SQLite, and Postgres when one answers)."""
    async with running_api(settings_for(bus.url, store_url, data_dir)) as running:
        yield running
