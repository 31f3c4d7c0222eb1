"""The region's leader lease (ADR-0021): one scheduler leads, a second stands by and takes over,
and a deposed leader can neither commit a decision nor write a desired state.

Real parts: the session's nats-server (a single node, where every desired write is fenced on
the bus) and one SQLite store shared by both schedulers, as two processes of a cell share one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js.errors import APIError

from einsora.common.bus import names
from einsora.common.schemas import LeaderLease
from einsora.common.settings import Settings
from einsora.common.testing import Bus, until
from einsora.scheduler.book import Changes
from einsora.scheduler.service import SchedulerService
from einsora.scheduler.store import Deposed

LEASE_S = 0.6


def _settings(bus: Bus, database_url: str, data_dir: Path) -> Settings:
    return Settings(
        nats_url=bus.url,
        database_url=database_url,
        region="local",
        sim_machines=True,  # Sim's machines report the sim driver
        data_dir=data_dir,
        scheduler_lease_s=LEASE_S,
        scheduler_tokens_key=data_dir.parent / "workload-tokens.key",
    )


async def _lease(bus: Bus) -> LeaderLease:
    entry = await bus.js.key_value(names.MACHINES.name)
    found = await entry.get(names.leader_term_key("local"))
    assert found.value is not None
    return LeaderLease.from_bytes(found.value)


async def test_a_second_scheduler_stands_by_and_takes_over_when_the_leader_stops(
    bus: Bus, sqlite_url: str, tmp_path: Path
) -> None:
    first = SchedulerService(_settings(bus, sqlite_url, tmp_path / "a"), tick_s=0.1)
    second = SchedulerService(_settings(bus, sqlite_url, tmp_path / "b"), tick_s=0.1)
    await first.start()
    try:
        assert first.leading.is_set()
        await second.start()  # returns at once, standing by
        assert not second.leading.is_set()
        term = (await _lease(bus)).term
        await first.stop()  # a clean stop releases the lease: no wait for it to lapse
        await until(second.leading.is_set, within_s=5, what="the standby leads")
        lease = await _lease(bus)
        assert lease.term == term + 1
        assert lease.holder != (await _holder(tmp_path / "a"))
    finally:
        await first.stop()
        await second.stop()


async def _holder(data_dir: Path) -> str:
    return (data_dir / "scheduler" / "holder-local").read_text().strip()


async def test_a_deposed_leader_can_neither_commit_nor_write_desired_state(
    bus: Bus, sqlite_url: str, tmp_path: Path
) -> None:
    old = SchedulerService(_settings(bus, sqlite_url, tmp_path / "a"), tick_s=0.1)
    new = SchedulerService(_settings(bus, sqlite_url, tmp_path / "b"), tick_s=0.1)
    await old.start()
    try:
        assert old._lease is not None
        assert old._store is not None
        fence = old._lease.fence
        store_fence = old._store.fence
        # The old leader stalls (its heartbeats stop) without knowing it: the standby takes over
        # once a lease passes without one.
        renewing = old._lease._renewing
        assert renewing is not None
        renewing.cancel()
        await new.start()
        await until(new.leading.is_set, within_s=10, what="the standby takes over")
        assert (await _lease(bus)).term > (store_fence[1] if store_fence else 0)

        # Its next commit is refused by the store, and changes nothing.
        with pytest.raises(Deposed):
            await old._store.commit(Changes(), [])
        # Its desired-state writes are refused by NATS: the term key moved on.
        with pytest.raises(APIError) as refused:
            await bus.js.publish(
                names.MACHINES.key_subject(names.desired_key("m-1")), b"{}", headers=fence
            )
        assert refused.value.err_code == 10071  # wrong last sequence
        # The new leader's own writes go through.
        assert new._lease is not None
        stored = await bus.js.publish(
            names.MACHINES.key_subject(names.desired_key("m-1")), b"{}", headers=new._lease.fence
        )
        assert stored.seq > 0
    finally:
        await old.stop()
        await new.stop()
