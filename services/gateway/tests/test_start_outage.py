"""A gateway started while NATS is down comes up once it is back (issue 35, F5).

The services of a cell start in any order and restart at any time; the docs promise they wait
for what they need. A real nats-server is stopped before the gateway starts and started again
on the same port: the gateway must wait, say so once, and then serve.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest

from einsora.common.bus import close_quietly, connect, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.service import start_unless_stopped
from einsora.common.testing import until
from einsora.gateway.service import GatewayService
from einsora.gateway.testing import gateway_settings

RETRYING = "start-up step failed; retrying with back-off"


async def test_a_gateway_started_while_nats_is_down_serves_once_it_is_back(
    own_nats_server: EmbeddedNats, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    own_nats_server.stop()
    gateway = GatewayService(gateway_settings(own_nats_server.url, data_dir))
    starting = asyncio.create_task(gateway.start())
    nc = None
    try:
        await until(
            lambda: (
                starting.done()
                or any(
                    r.getMessage() == RETRYING and getattr(r, "step", None) == "connecting to NATS"
                    for r in caplog.records
                )
            ),
            within_s=20,
            what="the gateway waiting for NATS",
        )
        assert not starting.done(), starting.exception()  # it did not exit

        own_nats_server.start()
        nc = await connect(own_nats_server.url, name="test-api")
        await provision(nc.jetstream())  # what the api provisions, as it does
        await asyncio.wait_for(starting, 30)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{gateway.port}/v1/models") as answer,
        ):
            assert answer.status == 401  # it serves (and asks for a key)
        said = [r.getMessage() for r in caplog.records if r.name == "einsora.startup"]
        assert said.count(RETRYING) == 1
    finally:
        if not starting.done():
            starting.cancel()
        await gateway.stop()
        await close_quietly(nc)


async def test_a_gateway_waiting_for_nats_stops_on_a_signal(
    own_nats_server: EmbeddedNats, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What `einsora gateway` does on SIGTERM while its start waits: stop there, cleanly."""
    own_nats_server.stop()
    gateway = GatewayService(gateway_settings(own_nats_server.url, data_dir))
    signalled = asyncio.Event()
    serving = asyncio.create_task(start_unless_stopped(gateway, signalled))
    await until(
        lambda: any(r.getMessage() == RETRYING for r in caplog.records),
        within_s=20,
        what="the gateway waiting for NATS",
    )
    signalled.set()
    assert await asyncio.wait_for(serving, 10) is False
    assert gateway.usage is None  # it never got as far as serving
