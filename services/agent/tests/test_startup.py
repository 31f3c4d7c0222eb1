"""Starting against a bus that is not provisioned: a clear error, or provisioning on request."""

from __future__ import annotations

from pathlib import Path

import pytest

from einsora.agent.service import AgentService
from einsora.agent.testing import ControlPlane
from einsora.common.bus import bind_bucket, connect, names
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.errors import EinsoraError
from einsora.common.settings import Settings


async def test_an_unprovisioned_bus_is_named_in_the_error(
    own_nats_server: EmbeddedNats, data_dir: Path
) -> None:
    settings = Settings(nats_url=own_nats_server.url, data_dir=data_dir)
    agent = AgentService(settings, machine_id="m-np", driver="sim")
    with pytest.raises(EinsoraError) as raised:
        await agent.start()
    assert raised.value.code == "bus_not_provisioned"
    assert own_nats_server.url in raised.value.message
    await agent.stop()  # idempotent after a failed start


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
