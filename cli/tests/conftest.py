"""Fixtures for the CLI's tests: a real api on the test's bus, which `einsora` commands run
against as processes (`einsora.api.testing.cli_env` and `einsora`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from einsora.api.testing import RunningApi, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus


@pytest_asyncio.fixture
async def api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    # Its machines join from this host, reached directly; it checks model files under the
    # test's own directory (ADR-0026: the operator's choices).
    settings = Settings(
        nats_url=bus.url,
        database_url=sqlite_url,
        data_dir=data_dir,
        direct_machine_networks="127.0.0.0/8,::1/128",
        model_dirs=str(data_dir.parent),
    )
    async with running_api(settings) as running:
        yield running
