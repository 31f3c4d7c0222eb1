"""The faults, seeded, one at a time: each injected, held, healed, and the cell given a moment
to notice before the next.

- a service SIGKILLed (the api, the scheduler that leads, the standby, accounting, a sim agent,
  a joined agent) is started again, as compose's `restart: unless-stopped` would; the leader
  only once a later term holds the lease (or the bound passed), so a takeover is what is
  measured, not its own return;
- a service SIGSTOPped is SIGCONTed: the leader past its lease, the others for seconds;
- a NATS node is SIGKILLed and started again on its ports and store;
- an agent is partitioned past `lost_after` (SIGSTOP: its connection is held and silent), and
  comes back.

The supervisor is the compose restart policy for the rest of the time: a service that exits
by itself (a fault's victim or not) is recorded and started again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from nats.js.errors import APIError, ServiceUnavailableError
from tests.chaos.cell import Cell
from tests.chaos.collect import MIRROR
from tests.chaos.model import Fault, FaultKind
from tests.chaos.process import Proc, until

from einsora.common.bus import names

log = logging.getLogger("einsora.chaos")

MUST = (FaultKind.leader_kill, FaultKind.agent_partition)
"""Every run has these, however short."""
TAKEOVER_BOUND_S = 30.0
"""How long a leader fault waits for a later term before it heals the leader anyway."""


def plan(rng: random.Random, count: int) -> list[FaultKind]:
    """`count` faults: every kind once while there is room (the leader's SIGKILL and a partition
    always), then again; in a seeded order."""
    kinds = list(FaultKind)
    rest = [k for k in kinds if k not in MUST]
    rng.shuffle(rest)
    chosen = [*MUST, *rest][:count]
    while len(chosen) < count:
        chosen.append(rng.choice(kinds))
    rng.shuffle(chosen)
    return chosen


@dataclass
class Exit:
    """A service that exited by itself."""

    name: str
    code: int | None
    at: float
    tail: str


@dataclass
class Injector:
    cell: Cell
    rng: random.Random
    http: aiohttp.ClientSession
    faults: list[Fault] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    _down: set[str] = field(default_factory=set)
    """Processes a fault holds down: the supervisor leaves them alone."""

    async def run(self, kinds: list[FaultKind], *, warmup_s: float, gap_s: float) -> None:
        await asyncio.sleep(warmup_s)
        for kind in kinds:
            fault = await self.inject(kind)
            log.info(
                "fault %s of %s held %.1f s %s", kind.value, fault.target, fault.held_s, fault.note
            )
            self.faults.append(fault)
            await asyncio.sleep(gap_s * self.rng.uniform(0.6, 1.4))

    async def supervise(self, every_s: float = 1.0) -> None:
        """Restart what exits by itself, recording it (until cancelled)."""
        while True:
            await asyncio.sleep(every_s)
            for proc in self.cell.services:
                if proc.name in self._down or proc.alive or proc.starts == 0:
                    continue
                self.exits.append(Exit(proc.name, proc.returncode, time.time(), proc.tail(12)))
                log.warning(
                    "%s exited by itself (status %s); starting it again", proc.name, proc.returncode
                )
                proc.start()

    async def inject(self, kind: FaultKind) -> Fault:
        cell, rng = self.cell, self.rng
        if kind in (FaultKind.leader_kill, FaultKind.leader_stop):
            return await self._leader(kind)
        if kind in (FaultKind.standby_kill, FaultKind.standby_stop):
            await until(_has_leader(cell), 30, "a scheduler leads")
            leader, _ = await cell.leader()
            target = next(p for p in cell.schedulers if p is not leader)
            return await self._signal(kind, target, rng.uniform(1.0, 4.0))
        if kind is FaultKind.nats_kill:
            return await self._nats()
        target, hold = {
            FaultKind.api_kill: (cell.api, rng.uniform(1.0, 3.0)),
            FaultKind.api_stop: (cell.api, rng.uniform(2.0, 5.0)),
            FaultKind.accounting_kill: (cell.accounting, rng.uniform(1.0, 3.0)),
            FaultKind.accounting_stop: (cell.accounting, rng.uniform(2.0, 5.0)),
            FaultKind.sim_agent_kill: (rng.choice(cell.sim_agents), rng.uniform(1.0, 3.0)),
            FaultKind.joined_agent_kill: (
                rng.choice(cell.joined or cell.sim_agents),
                rng.uniform(1.0, 3.0),
            ),
            FaultKind.agent_partition: (
                rng.choice([*cell.sim_agents, *cell.joined]),
                cell.shape.lost_after_s + rng.uniform(2.0, 4.0),
            ),
        }[kind]
        return await self._signal(kind, target, hold)

    async def _signal(self, kind: FaultKind, target: Proc, hold_s: float) -> Fault:
        """SIGKILL (then start again) or SIGSTOP (then SIGCONT) `target` for `hold_s`."""
        kill = kind.value.endswith("SIGKILL")
        fault = Fault(kind, target.name, time.time(), hold_s)
        self._down.add(target.name)
        try:
            if kill:
                target.kill()
            else:
                target.freeze()
            await asyncio.sleep(hold_s)
            if kill:
                target.start()
            else:
                target.thaw()
            fault.healed = time.time()
        finally:
            self._down.discard(target.name)
        await self._recovered(fault, target)
        return fault

    async def _recovered(self, fault: Fault, proc: Proc, within_s: float = 60.0) -> None:
        """Until `proc` serves again (a scheduler then settles as a standby for a lease, as in
        a real cell), so faults come one at a time; a note if it does not."""
        try:
            await until(lambda: self.cell.serving(proc, self.http), within_s, proc.name)
        except AssertionError:
            fault.note = f"{fault.note}; " if fault.note else ""
            fault.note += f"{proc.name} did not serve again within {within_s:g} s"
            return
        if proc in self.cell.schedulers:
            await asyncio.sleep(self.cell.shape.lease_s)

    async def _leader(self, kind: FaultKind) -> Fault:
        """The leader's loss: SIGKILL, or SIGSTOP for twice its lease and more."""
        cell = self.cell
        leader, lease = await cell.leader()
        if leader is None or lease is None:
            await until(_has_leader(cell), 30, "a scheduler leads before its loss")
            leader, lease = await cell.leader()
        assert leader is not None
        assert lease is not None
        kill = kind is FaultKind.leader_kill
        hold = 1.0 if kill else 2 * cell.shape.lease_s + self.rng.uniform(1.0, 3.0)
        fault = Fault(kind, leader.name, time.time(), hold, lost_term=lease.term)
        self._down.add(leader.name)
        try:
            if kill:
                leader.kill()
                try:
                    await until(_term_after(cell, lease.term), TAKEOVER_BOUND_S, "a takeover")
                except AssertionError:
                    fault.note = f"no later term within {TAKEOVER_BOUND_S:g} s"
                await asyncio.sleep(hold)
                leader.start()
            else:
                leader.freeze()
                await asyncio.sleep(hold)
                leader.thaw()
            fault.healed = time.time()
        finally:
            self._down.discard(leader.name)
        await self._recovered(fault, leader)
        return fault

    async def _nats(self) -> Fault:
        """A node that leads neither the machines bucket's stream nor the harness's mirror: a
        mirror whose source moves re-reads from where it was, and the bucket keeps one value
        a key, so what was replaced meanwhile would be missing from the record."""
        keep = await self._record_leaders()
        nodes = [n for n in self.cell.nodes if n.server_name not in keep] or self.cell.nodes
        node = self.rng.choice(nodes)
        hold = self.rng.uniform(3.0, 6.0)
        fault = Fault(FaultKind.nats_kill, node.server_name, time.time(), hold)
        fault.note = f"spared {', '.join(sorted(keep))}: the record's streams lead there"
        await asyncio.to_thread(node.kill)
        await asyncio.sleep(hold)
        await asyncio.to_thread(node.start)
        fault.healed = time.time()
        await until(self._jetstream_answers, 60, "JetStream answers after a node's return")
        return fault

    async def _record_leaders(self) -> set[str]:
        assert self.cell.nc is not None
        js = self.cell.nc.jetstream(timeout=5)
        leaders = set()
        for stream in (names.MACHINES.stream, MIRROR):
            try:
                info = await js.stream_info(stream)
            except (ServiceUnavailableError, APIError, TimeoutError):
                continue
            if info.cluster is not None and info.cluster.leader:
                leaders.add(info.cluster.leader)
        return leaders

    async def _jetstream_answers(self) -> bool:
        assert self.cell.nc is not None
        try:
            await self.cell.nc.jetstream(timeout=2).stream_info(names.EVENTS.name)
        except (ServiceUnavailableError, APIError, TimeoutError):
            return False
        return True


def _has_leader(cell: Cell) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        leader, _ = await cell.leader()
        return leader is not None

    return check


def _term_after(cell: Cell, term: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        _, lease = await cell.leader()
        return lease is not None and lease.term > term

    return check
