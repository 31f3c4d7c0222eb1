"""ApiService's shape: starts ready, stops twice, keeps the owner across restarts, names a
taken port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from einsora.api.service import ApiService
from einsora.api.testing import running_api
from einsora.common.errors import PortInUse
from einsora.common.settings import Settings
from einsora.common.testing import Bus


async def test_restart_keeps_the_owner_and_its_token(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = Settings(nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir)
    async with running_api(settings) as first:
        token = first.service.owner_token_created
        assert token is not None
        created = await first.owner.post("/v1/workloads", {"kind": "vm", "class": "cpu-1c-2g"})
    async with running_api(settings) as second:
        assert second.service.owner_token_created is None
        assert second.owner.token == token
        shown = await second.owner.get(f"/v1/workloads/{created.body['id']}")
        assert shown.status == 200
    await second.service.stop()  # a second stop does nothing


async def test_a_taken_port_is_named(bus: Bus, sqlite_url: str, data_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(
            nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir, api_port=port
        )
        service = ApiService(settings)
        with pytest.raises(PortInUse, match=str(port)):
            await service.start()
        await service.stop()
