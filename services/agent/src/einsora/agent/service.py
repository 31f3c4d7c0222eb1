"""The agent service: hosts one machine (or, for tests and benchmarks, many sim machines).

`start()` connects with the machine's own inbox prefix, binds the `machines` bucket without a
stream-info call, adopts what survived a restart, publishes the inventory, reads and watches each
machine's desired state, and returns once every machine has done its first read. `stop()` stops
the agent only: workloads keep running (live restore), and the next agent adopts them;
`stop_workloads()` is the explicit way to stop them all.

Shared by every machine of the process: one NATS connection, one observed-state publisher (with
the heartbeat), and one maintenance task (reconnects, periodic resync, inventory refresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Literal

import nats.errors
from nats.aio.client import Client as NATS
from nats.js.errors import NoStreamResponseError

from einsora.agent import identity, inventory, sim_inventory, workload_python
from einsora.agent.drivers import Driver, ProcessDriver, ProcessOptions, SimDriver, SimOptions
from einsora.agent.machine import MachineAgent
from einsora.agent.publisher import ObservedPublisher
from einsora.agent.records import RecordStore
from einsora.agent.supervisor import Timing
from einsora.common.bus import bind_bucket, connect, identities, names, provision
from einsora.common.errors import ConfigError, EinsoraError
from einsora.common.schemas import Inventory
from einsora.common.settings import Settings

log = logging.getLogger("einsora.agent")

DriverName = Literal["process", "sim"]
OPEN_CONCURRENCY = 64
TICK_S = 0.5


class AgentService:
    """The agent of one machine, or of `sim_machines` sim machines sharing one connection."""

    name = "agent"

    def __init__(
        self,
        settings: Settings,
        *,
        machine_id: str | None = None,
        driver: DriverName = "process",
        sim_inventory: str | None = None,
        sim_machines: int = 1,
        heartbeat_s: float = 10.0,
        grace_s: float = 10.0,
        start_timeout_s: float = 300.0,
        poll_s: float = 1.0,
        resync_s: float = 60.0,
        inventory_s: float = 60.0,
        sim_start_delay_s: float = 0.0,
        sim_fail_rate: float = 0.0,
        python: str | None = None,
        provision_bus: bool = False,
    ) -> None:
        if driver not in ("process", "sim"):
            raise ConfigError(f"unknown driver {driver!r}: choose sim or process")
        if driver == "process" and (sim_inventory is not None or sim_machines != 1):
            raise ConfigError(
                "--sim-inventory and --sim-machines need the sim driver (--driver sim)"
            )
        for label, value in (
            ("heartbeat", heartbeat_s),
            ("grace", grace_s),
            ("poll", poll_s),
            ("resync", resync_s),
            ("inventory refresh", inventory_s),
        ):
            if value <= 0:
                raise ConfigError(f"the {label} interval must be more than 0 s, not {value}")
        if not 0.0 <= sim_fail_rate <= 1.0:
            raise ConfigError(f"the sim fail rate is a share from 0 to 1, not {sim_fail_rate}")
        self.settings = settings
        self.driver_name: DriverName = driver
        base = identity.resolve_machine_id(settings.data_dir, machine_id)
        self.machine_ids = identity.sim_machine_ids(base, sim_machines)
        self._inbox_machine = base
        self.sim_machine = sim_inventory_spec(sim_inventory) if driver == "sim" else None
        self.heartbeat_s = heartbeat_s
        self.resync_s = resync_s
        self.inventory_s = inventory_s
        self.provision_bus = provision_bus
        self.timing = Timing(grace_s=grace_s, start_timeout_s=start_timeout_s)
        self.driver: Driver
        if driver == "sim":
            self.driver = SimDriver(
                SimOptions(start_delay_s=sim_start_delay_s, fail_rate=sim_fail_rate)
            )
        else:
            options = ProcessOptions(poll_s=poll_s)
            python = python or _workload_python(options)
            if python is not None:
                options = ProcessOptions(python=python, poll_s=poll_s)
            self.driver = ProcessDriver(options)
        self.machines: dict[str, MachineAgent] = {}
        self.publisher: ObservedPublisher[MachineAgent] | None = None
        self._nc: NATS | None = None
        self._maintenance: asyncio.Task[None] | None = None

    @property
    def machine_id(self) -> str:
        """The (first) machine this agent serves."""
        return self.machine_ids[0]

    # --- life -------------------------------------------------------------------------------

    async def start(self) -> None:
        url = self.settings.effective_nats_url
        credentials_dir = self.settings.nats_credentials_dir
        nc = await connect(
            url,
            name=f"einsora-agent {self._inbox_machine}",
            inbox_prefix=names.agent_inbox_prefix(self._inbox_machine),
            # A machine's identity is its machine id; its permissions reach its own keys only.
            credentials=None
            if credentials_dir is None
            else identities.load_identity(credentials_dir, self._inbox_machine),
        )
        self._nc = nc
        js = nc.jetstream()
        try:
            if self.provision_bus:
                await provision(js)
            kv = bind_bucket(js, names.MACHINES)
            publisher: ObservedPublisher[MachineAgent] = ObservedPublisher(
                lambda: self.machines.values(), lambda m: m.put_observed(), self.heartbeat_s
            )
            self.publisher = publisher
            for machine_id in self.machine_ids:
                self.machines[machine_id] = MachineAgent(
                    machine_id,
                    js=js,
                    kv=kv,
                    driver=self.driver,
                    inventory=await self._inventory(machine_id),
                    workloads_dir=self._workloads_dir(),
                    records=self._records(machine_id),
                    timing=self.timing,
                    on_change=publisher.mark,
                )
            publisher.start()
            await _bounded(self.machines.values(), lambda m: m.open())
        except (nats.errors.NoRespondersError, NoStreamResponseError) as exc:
            await self.stop()
            raise EinsoraError(
                f"the {names.MACHINES.name} bucket does not exist on NATS at {url}: provision "
                "the bus first (einsora solo and the scheduler do)",
                code="bus_not_provisioned",
                retryable=True,
            ) from exc
        except BaseException:
            await self.stop()
            raise
        self._maintenance = asyncio.create_task(self._maintain(nc), name="agent maintenance")
        log.info(
            "agent started",
            extra={"machines": len(self.machines), "driver": self.driver_name, "nats": url},
        )

    async def stop(self) -> None:
        """Stop the agent; its workloads keep running (a restarted agent adopts them)."""
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
            self._maintenance = None
        await asyncio.gather(*(m.close() for m in self.machines.values()))
        if self.publisher is not None:
            await self.publisher.stop()
            self.publisher = None
        self.machines = {}
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            await nc.close()

    async def stop_workloads(self) -> None:
        """Stop every workload of every machine (directories kept), and report it."""
        await asyncio.gather(*(m.stop_workloads() for m in self.machines.values()))

    def running_count(self) -> int:
        """How many workloads the agent has live now (starting, running or stopping): those a
        `stop()` leaves running."""
        return sum(
            1
            for m in self.machines.values()
            for s in m.supervisors.values()
            if s.handle is not None
        )

    # --- parts ------------------------------------------------------------------------------

    async def _inventory(self, machine_id: str) -> Inventory:
        if self.sim_machine is not None:
            return self.sim_machine.inventory(machine_id, self.settings.region, ["sim"])
        return await asyncio.to_thread(
            inventory.collect, machine_id, self.settings.region, [self.driver_name]
        )

    def _workloads_dir(self) -> Path | None:
        return None if self.driver_name == "sim" else self.settings.data_dir / "workloads"

    def _records(self, machine_id: str) -> RecordStore | None:
        if self.driver_name == "sim":
            return None
        return RecordStore(self.settings.data_dir / "agent" / machine_id / "workloads")

    async def _maintain(self, nc: NATS) -> None:
        """Reconnects (re-watch and re-read), periodic resync, inventory refresh."""
        reconnects = nc.stats["reconnects"]
        next_resync = time.monotonic() + self.resync_s
        next_inventory = time.monotonic() + self.inventory_s
        pending: set[str] = set()
        while True:
            await asyncio.sleep(TICK_S)
            if nc.stats["reconnects"] != reconnects:
                reconnects = nc.stats["reconnects"]
                log.info("reconnected to NATS: watching and reading desired states again")
                pending = set(self.machines)
            if pending:
                pending = await self._each(pending, _rewatch)
            now = time.monotonic()
            if now >= next_resync:
                next_resync = now + self.resync_s
                await self._each(set(self.machines), _resync)
            if now >= next_inventory and self.sim_machine is None:
                next_inventory = now + self.inventory_s
                await self._each(set(self.machines), self._refresh_inventory)

    async def _each(
        self, machine_ids: set[str], action: Callable[[MachineAgent], Awaitable[None]]
    ) -> set[str]:
        """Run `action` on each machine; return the ids where it failed (NATS away)."""
        failed: set[str] = set()

        async def one(m: MachineAgent) -> None:
            try:
                await action(m)
            except (nats.errors.Error, TimeoutError) as exc:
                failed.add(m.machine_id)
                log.warning(
                    "machine sync step failed; retrying",
                    extra={"machine": m.machine_id, "error": repr(exc)},
                )

        await _bounded([self.machines[i] for i in machine_ids if i in self.machines], one)
        return failed

    async def _refresh_inventory(self, machine: MachineAgent) -> None:
        fresh = await self._inventory(machine.machine_id)
        if not inventory.same(fresh, machine.inventory):
            machine.inventory = fresh
            await machine.put_inventory()


async def _rewatch(machine: MachineAgent) -> None:
    await machine.rewatch()
    await machine.put_inventory()
    await machine.put_observed()


async def _resync(machine: MachineAgent) -> None:
    """Re-read the desired key (a safety net for a watch lost silently) and write the inventory
    again (a wiped bucket gets it back; an agent may not read its own inventory key)."""
    await machine.resync()
    await machine.put_inventory()


async def _bounded(
    machines: Iterable[MachineAgent], action: Callable[[MachineAgent], Awaitable[None]]
) -> None:
    semaphore = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(m: MachineAgent) -> None:
        async with semaphore:
            await action(m)

    await asyncio.gather(*(one(m) for m in machines))


def sim_inventory_spec(spec: str | None) -> sim_inventory.SimMachine:
    """The declared sim machine (a plain default one when no spec is given)."""
    return sim_inventory.load(spec) if spec else sim_inventory.SimMachine()


def _workload_python(options: ProcessOptions) -> str | None:
    """A Python that workloads' own users can run, when the agent's own is out of their reach.

    A root agent runs workloads as unprivileged users (ADR-0007). Where its interpreter lives in
    a private home (a venv over pyenv under /root), they could not run Jupyter at all; the
    system's python3 of the same version, with the agent's packages, serves them instead. None:
    the agent's own will do, or nothing will (the driver then refuses with the path).
    """
    if not options.unprivileged:
        return None
    scratch = options.homes / "python"
    try:
        scratch.mkdir(mode=0o755, parents=True, exist_ok=True)
        options.homes.chmod(0o711)
    except OSError as exc:
        log.warning(
            "no place for a workload Python", extra={"dir": str(scratch), "error": str(exc)}
        )
        return None
    found = workload_python.find(scratch)
    if isinstance(found, str):
        log.warning("workloads may not run Python", extra={"reason": found})
        return None
    return None if found.path == options.python else found.path
