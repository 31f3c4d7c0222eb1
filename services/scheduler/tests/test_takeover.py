"""A standby takes over whatever the bus does during its attempt (issue 35, F2).

Before, a NATS error while a standby watched the lease or tried to take it (the server
restarting, the bucket briefly gone: no responders, no stream response, a timeout) ended its
task; the process stayed up with no leader, and the region had no scheduler until a restart.
Every loop of the scheduler now survives every transient error class (einsora.common.transient).

Real parts: a nats-server of the test's own, which it stops and starts again, and one SQLite
store shared by the two schedulers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from einsora.common.bus import connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.settings import Settings
from einsora.common.testing import until
from einsora.scheduler.service import SchedulerService

LEASE_S = 0.6
OUTAGE_S = 4 * LEASE_S
"""How long the bucket stays away: the standby polls it many times meanwhile."""


def _scheduler(url: str, database_url: str, data_dir: Path) -> SchedulerService:
    settings = Settings(
        nats_url=url,
        database_url=database_url,
        region="local",
        sim_machines=True,
        data_dir=data_dir,
        scheduler_lease_s=LEASE_S,
        scheduler_tokens_key=data_dir.parent / "workload-tokens.key",
    )
    return SchedulerService(settings, tick_s=0.1, audit_s=0.2)


async def _leader_stalls_and_standby_waits(
    url: str, sqlite_url: str, tmp_path: Path
) -> tuple[SchedulerService, SchedulerService]:
    old = _scheduler(url, sqlite_url, tmp_path / "a")
    standby = _scheduler(url, sqlite_url, tmp_path / "b")
    await old.start()
    await standby.start()
    assert old.leading.is_set()
    assert not standby.leading.is_set()
    assert old._lease is not None
    renewing = old._lease._renewing
    assert renewing is not None
    renewing.cancel()  # the leader stalls: no heartbeat from here
    return old, standby


async def test_a_standby_takes_over_though_the_bucket_was_gone_during_its_attempt(
    own_nats_server: EmbeddedNats, sqlite_url: str, tmp_path: Path
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    old, standby = await _leader_stalls_and_standby_waits(own_nats_server.url, sqlite_url, tmp_path)
    try:
        # The lease's bucket goes away under the standby (its reads answer "no responders"),
        # and comes back, empty.
        await js.delete_stream(names.MACHINES.stream)
        await asyncio.sleep(OUTAGE_S)  # the fault's length, not a wait
        await provision(js)
        await until(standby.leading.is_set, within_s=15, what="the standby takes over")
    finally:
        await old.stop()
        await standby.stop()
        await nc.close()


@pytest.mark.slow
async def test_a_standby_takes_over_though_the_server_restarted_during_its_attempt(
    own_nats_server: EmbeddedNats, sqlite_url: str, tmp_path: Path
) -> None:
    old, standby = await _leader_stalls_and_standby_waits(own_nats_server.url, sqlite_url, tmp_path)
    try:
        own_nats_server.stop()
        # Down for longer than a request waits (nats-py's JetStream timeout, 5 s): the reads
        # of the lease the standby makes meanwhile fail.
        await asyncio.sleep(6.0)  # the fault's length, not a wait
        own_nats_server.start()
        await until(standby.leading.is_set, within_s=30, what="the standby takes over")
    finally:
        await old.stop()
        await standby.stop()
