"""A long store outage loses nothing (issue 10: a retryable failure never drops a message).

Before, a consumer gave up on a message after 20 deliveries (back-off 0.2/1/5 s): a store
outage of about 90 s lost intents, and a later `remove` was ignored. Here the scheduler's own
Postgres database refuses every connection for three minutes while 200 launches, parks and
removes arrive; once it is back, every one converges, none lost and none applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from einsora.common.bus import names
from einsora.common.runloop import raise_if_cancelled

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

OUTAGE_S = 180.0
HEARTBEAT_S = 5.0
CLASS = "cpu-1c-2g"


async def _set_connections(postgres_url: str, allowed: bool) -> None:
    """Let the database take connections again, or refuse them and end the open ones."""
    url = make_url(postgres_url)
    admin_dsn = url.set(drivername="postgresql", database="postgres").render_as_string(
        hide_password=False
    )
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(
            f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS {"true" if allowed else "false"}'
        )
        if not allowed:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                url.database,
            )
    finally:
        await admin.close()


class _Agent:
    """Machine m-1's agent: reports what it applied, and again every few seconds (its heartbeat),
    store or no store. A machine silent through the outage would be suspect (no new placements)
    once the scheduler is back, whatever the intents did."""

    def __init__(self, sim: Sim) -> None:
        self._sim = sim
        self._phases: dict[str, str] = {}
        self._generation = 0
        self._beating: asyncio.Task[None] | None = None

    async def report(self, phases: dict[str, str]) -> None:
        current = self._sim.desired.get("m-1")
        self._phases, self._generation = phases, current.generation if current else 0
        await self._sim.report("m-1", phases, generation=self._generation)
        if self._beating is None:
            self._beating = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            raise_if_cancelled()  # a cancel its report swallowed ends it too
            await asyncio.sleep(HEARTBEAT_S)
            await self._sim.report("m-1", self._phases, generation=self._generation)

    async def stop(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating


def _count(sim: Sim, workload_id: str, state: str) -> int:
    return [e.state.value for e in sim.events[workload_id]].count(state)


@pytest.mark.long
@pytest.mark.postgres
@pytest.mark.timeout(OUTAGE_S + 240)
async def test_200_intents_during_a_three_minute_store_outage_all_converge(
    sim: Sim, start_scheduler: StartScheduler, postgres_url: str
) -> None:
    agent = _Agent(sim)
    try:
        await _outage(sim, start_scheduler, postgres_url, agent)
    finally:
        await agent.stop()


async def _outage(
    sim: Sim, start_scheduler: StartScheduler, postgres_url: str, agent: _Agent
) -> None:
    await sim.join("m-1", cpus=512, memory_gib=2048)
    await start_scheduler(postgres_url)
    to_park = [await sim.launch(CLASS) for _ in range(40)]
    to_remove = [await sim.launch(CLASS) for _ in range(40)]
    for w in to_park + to_remove:
        await sim.wait_state(w, "scheduled", within_s=60)
    await agent.report({w: "running" for w in to_park + to_remove})
    for w in to_park + to_remove:
        await sim.wait_state(w, "running", within_s=60)

    before = await sim.bus.js.consumer_info(names.INTENTS.name, "scheduler-local")
    await _set_connections(postgres_url, allowed=False)
    try:
        launched = [await sim.launch(CLASS) for _ in range(120)]
        for w in to_park:
            await sim.intent("park", w, CLASS)
        for w in to_remove:
            await sim.intent("remove", w, CLASS)
        # Longer than the old consumer's 20 deliveries took, with every intent still held.
        await asyncio.sleep(OUTAGE_S)
        info = await sim.bus.js.consumer_info(names.INTENTS.name, "scheduler-local")
        # Delivered more often than there are intents: they were retried, and none acked. (Not
        # `num_redelivered`, which counts only those out for delivery at this very instant.)
        assert info.delivered.consumer_seq - before.delivered.consumer_seq > 200, info
        assert info.num_pending + info.num_ack_pending == 200, info
        assert all(not sim.events.get(w) for w in launched)
    finally:
        await _set_connections(postgres_url, allowed=True)

    for w in launched:
        await sim.wait_state(w, "scheduled", within_s=120)
    for w in to_park:
        await sim.wait_state(w, "parking", within_s=60)
    for w in to_remove:
        await sim.wait_state(w, "removing", within_s=60)
    # The agent does what it was told: parks, stops the removed, runs the new.
    await agent.report({**{w: "parked" for w in to_park}, **{w: "running" for w in launched}})
    for w in to_park:
        await sim.wait_state(w, "parked", within_s=60)
    for w in to_remove:
        await sim.wait_state(w, "removed", within_s=60)
    for w in launched:
        await sim.wait_state(w, "running", within_s=60)

    # Each applied exactly once.
    for w in launched + to_park + to_remove:
        assert _count(sim, w, "scheduled") == 1, (w, sim.events[w])
    for w in to_park:
        assert _count(sim, w, "parking") == 1
        assert _count(sim, w, "parked") == 1
    for w in to_remove:
        assert _count(sim, w, "removing") == 1
        assert _count(sim, w, "removed") == 1
    info = await sim.bus.js.consumer_info(names.INTENTS.name, "scheduler-local")
    assert info.num_pending == 0
    assert info.num_ack_pending == 0
