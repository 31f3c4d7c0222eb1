"""Fixtures for accounting's tests: a real nats-server, real stores, and players of the other
services on the bus (einsora.accounting.testing), never a mock of accounting itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from einsora.accounting.service import AccountingService
from einsora.accounting.testing import GatewayPlayer, SchedulerPlayer
from einsora.common.settings import Settings
from einsora.common.testing import Bus


@pytest.fixture
def scheduler(bus: Bus) -> SchedulerPlayer:
    return SchedulerPlayer(bus.js)


@pytest.fixture
def gateway(bus: Bus) -> GatewayPlayer:
    return GatewayPlayer(bus.js)


StartAccounting = Callable[..., Awaitable[AccountingService]]


@pytest_asyncio.fixture
async def start_accounting(bus: Bus, data_dir: Path) -> AsyncIterator[StartAccounting]:
    """Start accounting on the test's bus with a database URL and options; stopped at the end
    (a test may stop one itself, and start another on the same store)."""
    started: list[AccountingService] = []

    async def start(
        database_url: str, *, settings: dict[str, Any] | None = None, **options: Any
    ) -> AccountingService:
        config = Settings(
            nats_url=bus.url,
            database_url=database_url,
            data_dir=data_dir,
            **(settings or {}),
        )
        options.setdefault("publish_debounce_s", 0.05)
        service = AccountingService(config, **options)
        await service.start()
        started.append(service)
        return service

    yield start
    for service in reversed(started):
        await service.stop()
