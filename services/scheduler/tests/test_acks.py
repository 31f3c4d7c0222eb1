"""When an intent is acked: once its decision is in the store, not once it is on the bus.

The store is the truth and the bus its projection (ADR-0004): a projection that cannot be
written now is the scheduler's to finish from what it stored, so holding the intent unacked
would only keep the next batch from being fetched and decided meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.common.bus import connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.settings import Settings
from einsora.common.testing import Bus
from einsora.scheduler.service import SchedulerService

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import NewSim


async def test_an_intent_is_acked_once_stored_and_its_event_follows_when_the_bus_takes_it(
    own_nats_server: EmbeddedNats, sqlite_url: str, sim_on: NewSim
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    sim = await sim_on(Bus(nc, js, own_nats_server.url))
    service = SchedulerService(
        Settings(
            nats_url=own_nats_server.url,
            database_url=sqlite_url,
            region="local",
            sim_machines=True,  # Sim's machines report the sim driver
        ),
        tick_s=0.1,
        audit_s=0.3,
    )
    await service.start()
    try:
        await sim.join("m-1", gpus=2)
        first = await sim.launch()
        await sim.wait_state(first, "scheduled")

        # Events can no longer be stored: every projection's events fail from here.
        await js.delete_stream(names.EVENTS.name)
        await sim.stop()
        await sim.start(events=False)
        second = await sim.launch()
        await sim.until(lambda: sim.placed_on(second), what="the second in a desired state")

        async def acked() -> bool:
            info = await js.consumer_info(names.INTENTS.name, "scheduler-local")
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        await sim.eventually(acked, 10, "the second intent acked without its event")

        await provision(js)  # EVENTS is back: the pending event goes out on a later cycle
        await sim.stop()
        await sim.start()
        scheduled = await sim.wait_state(second, "scheduled")
        assert scheduled.placement is not None
        assert scheduled.placement.machine == "m-1"
        assert [e.state.value for e in sim.events[second]] == ["scheduled"]
    finally:
        await service.stop()
        await sim.stop()
        await nc.close()
