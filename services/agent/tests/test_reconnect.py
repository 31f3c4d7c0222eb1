"""NATS restarted mid-flight: the agent reconnects, watches and reads its desired state again,
and acts on what was written while it was away."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats.errors

from einsora.agent.service import AgentService
from einsora.common.bus import bind_bucket, connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import ObservedPhase
from einsora.common.settings import Settings
from einsora.testing.agent import ControlPlane


async def _put_until_accepted(control: ControlPlane, generation: int, ids: list[str]) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            await control.put_desired("m-rc", generation, [control.workload(i) for i in ids])
            return
        except (nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_agent_survives_a_nats_restart(own_nats_server: EmbeddedNats, data_dir: Path) -> None:
    nc = await connect(own_nats_server.url, name="test-scheduler")
    await provision(nc.jetstream())
    control = ControlPlane(nc, bind_bucket(nc.jetstream(), names.MACHINES))
    agent = AgentService(
        Settings(nats_url=own_nats_server.url, data_dir=data_dir),
        machine_id="m-rc",
        driver="sim",
        heartbeat_s=0.5,
    )
    await agent.start()
    try:
        await _put_until_accepted(control, 1, ["w-a"])
        await control.wait_workload("m-rc", "w-a", lambda w: w.phase is ObservedPhase.running)

        own_nats_server.stop()
        own_nats_server.start()

        await _put_until_accepted(control, 2, ["w-a", "w-b"])
        state = await control.wait_observed(
            "m-rc",
            lambda s: (
                s.generation_applied == 2
                and {w.workload_id: w.phase for w in s.workloads}
                == {"w-a": ObservedPhase.running, "w-b": ObservedPhase.running}
            ),
        )
        assert state.generation_applied == 2
        # The watch works again too: a change after the restart arrives without a resync.
        await _put_until_accepted(control, 3, ["w-b"])
        await control.wait_observed(
            "m-rc",
            lambda s: s.generation_applied == 3,
            within_s=5,
        )
    finally:
        await agent.stop()
        await nc.close()
