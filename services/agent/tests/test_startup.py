"""Starting against a bus that is not provisioned: waited for, saying so, or provisioning on
request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from einsora.agent.service import AgentService
from einsora.common.bus import bind_bucket, connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.settings import Settings
from einsora.common.testing import until
from einsora.testing.agent import ControlPlane

WAITING = "the agent cannot read its machines' keys; retrying with back-off"


async def test_an_unprovisioned_bus_is_waited_for_and_named_in_the_log(
    own_nats_server: EmbeddedNats, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The parts of a cell start in any order (issue 35, F5): an agent that finds no `machines`
    bucket says so, naming the server, and comes up once the bus is provisioned."""
    settings = Settings(nats_url=own_nats_server.url, data_dir=data_dir)
    agent = AgentService(settings, machine_id="m-np", driver="sim", backoff_max_s=0.5)
    starting = asyncio.create_task(agent.start())
    nc = await connect(own_nats_server.url, name="test")
    try:
        await until(
            lambda: starting.done() or any(r.getMessage() == WAITING for r in caplog.records),
            what="the agent waiting for the bus",
        )
        assert not starting.done(), starting.exception()  # it did not exit
        [said] = [r for r in caplog.records if r.getMessage() == WAITING]
        assert getattr(said, "nats", None) == own_nats_server.url
        assert "provisioned" in str(getattr(said, "hint", ""))

        await provision(nc.jetstream())
        await asyncio.wait_for(starting, 15)
        control = ControlPlane(nc, bind_bucket(nc.jetstream(), names.MACHINES))
        inventory = await control.inventory("m-np")
        assert inventory is not None
    finally:
        if not starting.done():
            starting.cancel()
        await nc.close()
        await agent.stop()
        await agent.stop()  # idempotent


async def test_provision_bus_creates_the_buckets_first(
    own_nats_server: EmbeddedNats, data_dir: Path
) -> None:
    settings = Settings(nats_url=own_nats_server.url, data_dir=data_dir)
    agent = AgentService(settings, machine_id="m-pv", driver="sim", provision_bus=True)
    await agent.start()
    nc = await connect(own_nats_server.url, name="test")
    try:
        control = ControlPlane(nc, bind_bucket(nc.jetstream(), names.MACHINES))
        inv = await control.inventory("m-pv")
        assert inv is not None
        assert inv.drivers == ["sim"]
    finally:
        await nc.close()
        await agent.stop()
        await agent.stop()
