"""A deposed leader commits nothing and writes nothing (issue 35, F1; ADR-0021).

Before, a leader whose heartbeat was refused set the store's fence to "no check" first and told
its engine last, so the engine's next cycles committed unfenced; and an engine whose commit the
store refused rebuilt its book from the store and went on deciding, its KV audit "repairing"
the keys the new leader wrote. Now a deposed leader keeps its old term (the store refuses every
commit it attempts), and its engine and its audit stop before anything else.

Real parts: the session's nats-server and one SQLite store shared by two schedulers, as two
processes of a cell share one. A leader's stall is its renewal stopped (a SIGSTOPped process is
`test_frozen_leader.py`'s).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from einsora.common.bus import names
from einsora.common.schemas import LeaderLease
from einsora.common.settings import Settings
from einsora.common.testing import Bus, until
from einsora.scheduler.book import Changes
from einsora.scheduler.service import SchedulerService
from einsora.scheduler.store import Deposed

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim

LEASE_S = 0.6


def _settings(bus: Bus, database_url: str, data_dir: Path) -> Settings:
    return Settings(
        nats_url=bus.url,
        database_url=database_url,
        region="local",
        sim_machines=True,
        data_dir=data_dir,
        scheduler_lease_s=LEASE_S,
        scheduler_tokens_key=data_dir.parent / "workload-tokens.key",
    )


async def _term(bus: Bus) -> LeaderLease:
    kv = await bus.js.key_value(names.MACHINES.name)
    entry = await kv.get(names.leader_term_key("local"))
    assert entry.value is not None
    return LeaderLease.from_bytes(entry.value)


async def _stall_then_depose(
    bus: Bus, sqlite_url: str, tmp_path: Path
) -> tuple[SchedulerService, SchedulerService]:
    """A leads; its renewal stops (a stall it does not notice); B takes over."""
    old = SchedulerService(_settings(bus, sqlite_url, tmp_path / "a"), tick_s=0.1, audit_s=0.2)
    new = SchedulerService(_settings(bus, sqlite_url, tmp_path / "b"), tick_s=0.1, audit_s=0.2)
    await old.start()
    assert old._lease is not None
    renewing = old._lease._renewing
    assert renewing is not None
    renewing.cancel()
    await new.start()
    await until(new.leading.is_set, within_s=10, what="the standby takes over")
    return old, new


async def test_a_deposed_leader_keeps_its_old_term_so_the_store_refuses_its_commits(
    bus: Bus, sqlite_url: str, tmp_path: Path
) -> None:
    old, new = await _stall_then_depose(bus, sqlite_url, tmp_path)
    try:
        assert old._lease is not None
        assert old._store is not None
        old_term = old._lease.term
        # The stalled leader renews again: its heartbeat is refused, and it learns it was deposed.
        old._lease.keep(old._deposed)
        await until(lambda: not old.leading.is_set(), within_s=10, what="the old leader steps down")
        # Its fence still names the term it held: the store refuses whatever it would commit.
        assert old._store.fence == ("local", old_term)
        with pytest.raises(Deposed):
            await old._store.commit(Changes(), [])
        assert (await _term(bus)).holder == new._lease.holder  # type: ignore[union-attr]
    finally:
        await old.stop()
        await new.stop()


async def test_a_leader_whose_commit_the_store_refuses_stops_deciding_at_once(
    bus: Bus, sqlite_url: str, tmp_path: Path, sim: Sim
) -> None:
    """The store's refusal is news the lease has not brought yet (a leader just resumed): the
    engine stops there, rather than rebuild its book and go on, and the scheduler stands by."""
    await sim.join("m-1", gpus=2)
    old, new = await _stall_then_depose(bus, sqlite_url, tmp_path)
    try:
        await sim.until(lambda: sim.desired.get("m-1"), what="the new leader's desired state")
        # A machine joins: both leaders' watches see it, and the old one's cycle must commit it.
        await sim.join("m-2", gpus=2)
        engine = old.engine
        await until(lambda: engine.halted, within_s=10, what="the old leader's engine stops")
        await until(lambda: old._engine is None, within_s=10, what="the old leader steps down")
        assert not old.leading.is_set()
        # The new leader alone placed the machine; the old one's term never came back.
        await sim.until(lambda: sim.desired.get("m-2"), what="m-2's desired state")
        assert new.leading.is_set()
        assert (await _term(bus)).holder == new._lease.holder  # type: ignore[union-attr]
        # It stands by again, and takes over when the new leader stops.
        await new.stop()
        await until(old.leading.is_set, within_s=10, what="the old leader takes over again")
    finally:
        await old.stop()
        await new.stop()
