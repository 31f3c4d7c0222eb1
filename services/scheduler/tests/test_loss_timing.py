"""A silent machine is lost at its last heartbeat plus `lost_after`, whoever leads (issue 35, F7).

Before, a scheduler that took over timed every machine's silence from its own book's load, so a
machine already silent for a while was lost that much later, and its GPUs were metered for the
difference (accounting closes an allocation at the `failed` event's `at`). Now silence is timed
from the last heartbeat the bus recorded (its observed key's stored time, never the agent's own
clock), across a takeover and a reload; only after a long time without any leader (the whole
cell down) does every machine get a fresh grace period.

Real parts: the session's nats-server and one SQLite store shared by two schedulers.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from einsora.common.schemas import utcnow
from einsora.common.settings import Settings
from einsora.common.testing import Bus, until
from einsora.scheduler.service import SchedulerService

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim

SUSPECT_AFTER_S = 1.0
LOST_AFTER_S = 4.0
LEADS_FOR_S = 2.0
"""How long after the machine's last heartbeat the first leader stops and the standby takes
over: the difference the old timing added to the machine's loss."""


def _scheduler(bus: Bus, database_url: str, data_dir: Path) -> SchedulerService:
    settings = Settings(
        nats_url=bus.url,
        database_url=database_url,
        region="local",
        sim_machines=True,
        data_dir=data_dir,
        scheduler_lease_s=0.6,
        scheduler_tokens_key=data_dir.parent / "workload-tokens.key",
    )
    return SchedulerService(
        settings,
        tick_s=0.1,
        audit_s=0.3,
        suspect_after_s=SUSPECT_AFTER_S,
        lost_after_s=LOST_AFTER_S,
    )


async def test_after_a_takeover_a_silent_machine_is_lost_at_its_last_heartbeat_plus_lost_after(
    bus: Bus, sqlite_url: str, tmp_path: Path, sim: Sim
) -> None:
    first = _scheduler(bus, sqlite_url, tmp_path / "a")
    second = _scheduler(bus, sqlite_url, tmp_path / "b")
    await first.start()
    await second.start()
    try:
        await sim.join("m-1", gpus=2)
        w = await sim.launch()
        await sim.wait_state(w, "scheduled")
        await sim.report("m-1", {w: "running"})
        await sim.wait_state(w, "running")
        # Its last heartbeat: the machine is silent from here.
        await sim.report("m-1", {w: "running"})
        last_heartbeat_at, last_heartbeat = utcnow(), time.monotonic()
        await until(
            lambda: time.monotonic() - last_heartbeat >= LEADS_FOR_S,
            within_s=LEADS_FOR_S + 1,
            what="the first leader judges the silence a while",
        )
        assert first.leading.is_set()
        await first.stop()
        await until(second.leading.is_set, within_s=10, what="the standby takes over")

        failed = await sim.wait_state(w, "failed", within_s=LOST_AFTER_S + 10)
        lost_after = time.monotonic() - last_heartbeat
        assert "lost" in failed.reason, failed.reason
        # Lost when its last heartbeat was `lost_after` old (and a tick or two), not that long
        # after the takeover.
        assert lost_after < LOST_AFTER_S + 1.0, lost_after
        # The allocation ends at its last sign of life, as the bus recorded it.
        assert abs(failed.at - last_heartbeat_at) < timedelta(seconds=0.5), (
            failed.at,
            last_heartbeat_at,
        )
    finally:
        await first.stop()
        await second.stop()
