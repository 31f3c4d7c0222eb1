"""The agent service: hosts one machine (or, for tests and benchmarks, many sim machines).

`start()` connects with the machine's own inbox prefix, binds the `machines` bucket without a
stream-info call, adopts what survived a restart, publishes the inventory, reads and watches each
machine's desired state, and returns once every machine has done its first read. `stop()` stops
the agent only: workloads keep running (live restore), and the next agent adopts them;
`stop_workloads()` is the explicit way to stop them all.

Shared by every machine of the process: one NATS connection, one observed-state publisher (with
the heartbeat), one maintenance task (reconnects, periodic resync, inventory refresh), and
one watch on the owner's own reclaim (`reclaim.py`), which runs whether or not the bus is there.

The agent survives what nats-py does not. nats-py closes a connection for good when the server
ends it over its credential (an expired session, a revoked or removed user) and never tries
again; the agent then connects anew with capped, jittered back-off, moves every machine to the
new connection, watches and reads its desired state again and reports. A refused credential is
told from a network failure by asking the api (`GET /v1/machines/self`): a revoked machine's
agent stops for good and says so; anything else is retried, logged once per outage. So at
start: NATS away, its `machines` bucket not there yet, or a refusal while the api (whose auth
callout lets machines in) cannot be asked is waited out; only a credential the api says is
revoked or unknown ends the start. nats-py's own close can fail before it says so, so the
agent also watches `is_closed`.

An enrolled machine (`einsora agent join`) runs with its enrolment: its machine id, its
credential as the NATS token, the NATS URL and CA it was given, and its tunnel when it has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from nats.aio.client import Client as NATS

from einsora.agent import (
    engines,
    identity,
    inventory,
    join,
    reclaim,
    sim_inventory,
    workload_python,
)
from einsora.agent.downloads import DownloadPolicy
from einsora.agent.drivers import Driver, ProcessDriver, ProcessOptions, SimDriver, SimOptions
from einsora.agent.drivers.container import DockerDriver, DockerOptions
from einsora.agent.drivers.registry import DriverSet
from einsora.agent.drivers.vm import LibvirtDriver, VmOptions
from einsora.agent.engines import EngineOptions
from einsora.agent.join import Enrolled, MachineRevoked, MachineUnknown
from einsora.agent.machine import MachineAgent
from einsora.agent.observability import AgentMetrics
from einsora.agent.publisher import ObservedPublisher
from einsora.agent.records import RecordStore
from einsora.agent.supervisor import Timing
from einsora.common import startup
from einsora.common.bus import (
    bind_bucket,
    close_quietly,
    connect,
    identities,
    names,
    provision,
    reconnects,
    tls_trusting,
)
from einsora.common.bus.connect import CredentialRefused, shown_url
from einsora.common.bus.identities import Identity
from einsora.common.errors import BusUnavailable, ConfigError, EinsoraError
from einsora.common.metrics import MetricsServer, serve
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import Gpu, Inventory, utcnow
from einsora.common.settings import Settings
from einsora.common.transient import is_transient

if TYPE_CHECKING:
    from einsora.agent.tunnel import AgentTunnel

log = logging.getLogger("einsora.agent")

DriverName = Literal["process", "sim"]
OPEN_CONCURRENCY = 64
TICK_S = 0.5
BACKOFF_MIN_S = 0.25
INVENTORY_PUT_S = 2.0
PHASES_EVERY_TICKS = 10


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
        enrolment: Enrolled | None = None,
        backoff_max_s: float = 30.0,
        engines: EngineOptions | None = None,
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
            ("reconnect back-off", backoff_max_s),
        ):
            if value <= 0:
                raise ConfigError(f"the {label} interval must be more than 0 s, not {value}")
        if not 0.0 <= sim_fail_rate <= 1.0:
            raise ConfigError(f"the sim fail rate is a share from 0 to 1, not {sim_fail_rate}")
        self.settings = settings
        self.enrolment = enrolment
        self.driver_name: DriverName = driver
        if enrolment is not None:
            if machine_id and machine_id != enrolment.machine_id:
                raise ConfigError(
                    f"this machine is enrolled as {enrolment.machine_id}, not {machine_id}: "
                    "leave --machine-id out, or join again"
                )
            if sim_machines != 1:
                raise ConfigError("an enrolled machine is one machine: --sim-machines needs none")
            base = enrolment.machine_id
        else:
            base = identity.resolve_machine_id(settings.data_dir, machine_id)
        self.machine_ids = identity.sim_machine_ids(base, sim_machines)
        # An enrolled machine's region is the control plane's decision, never its own.
        self.region = enrolment.region if enrolment is not None else settings.region
        self.nats_url = settings.nats_url or (
            enrolment.nats_url if enrolment is not None else settings.effective_nats_url
        )
        self.backoff_max_s = backoff_max_s
        self.fence_after_s = settings.agent_fence_after_s
        if 0 < self.fence_after_s <= 2 * heartbeat_s:
            raise ConfigError(
                f"the fence time ({self.fence_after_s:g} s) must be more than twice the "
                f"heartbeat ({heartbeat_s:g} s), or 0 (never): a machine in touch would stop "
                "its workloads"
            )
        self._inbox_machine = base
        self.sim_machine = sim_inventory_spec(sim_inventory) if driver == "sim" else None
        self.heartbeat_s = heartbeat_s
        self.resync_s = resync_s
        self.inventory_s = inventory_s
        self.provision_bus = provision_bus
        self.timing = Timing(grace_s=grace_s, start_timeout_s=start_timeout_s)
        self.downloads = DownloadPolicy.of(settings)
        """What model and image downloads may reach and bring: the machine owner's settings."""
        self.driver: Driver
        if driver == "sim":
            self.driver = SimDriver(
                SimOptions(start_delay_s=sim_start_delay_s, fail_rate=sim_fail_rate)
            )
        else:
            options = ProcessOptions(poll_s=poll_s, gpus=self._gpus, downloads=self.downloads)
            python = python or _workload_python(options)
            if python is not None:
                options = ProcessOptions(
                    python=python, poll_s=poll_s, gpus=self._gpus, downloads=self.downloads
                )
            self.driver = ProcessDriver(options)
        # Engines (libvirt, Docker) back drivers of their own beside `process`; sim has none.
        self.engines = None if driver == "sim" else (engines or EngineOptions())
        self.drivers = DriverSet([self.driver, *self._engine_drivers(poll_s)], self.driver.name)
        self.machines: dict[str, MachineAgent] = {}
        self.publisher: ObservedPublisher[MachineAgent] | None = None
        self._nc: NATS | None = None
        self._session: asyncio.Task[None] | None = None
        self._reclaims: asyncio.Task[None] | None = None
        self._revocation_check: asyncio.Task[None] | None = None
        self._credentials: Identity | None = None
        self._tls: ssl.SSLContext | None = None
        self._tunnel: AgentTunnel | None = None
        self.metrics = AgentMetrics(self.driver.name)
        self._metrics_server: MetricsServer | None = None
        self._gone = asyncio.Event()
        self.gone_reason: EinsoraError | None = None
        """Why the agent stopped for good on its own (its machine was revoked); None: it did
        not."""

    @property
    def metrics_port(self) -> int | None:
        """Where /metrics listens once started, when `agent_metrics_port` is set."""
        return None if self._metrics_server is None else self._metrics_server.port

    @property
    def machine_id(self) -> str:
        """The (first) machine this agent serves."""
        return self.machine_ids[0]

    # --- life -------------------------------------------------------------------------------

    async def start(self) -> None:
        credentials_dir = self.settings.nats_credentials_dir
        # A machine's identity is its machine id; its permissions reach its own keys only.
        if credentials_dir is not None:
            self._credentials = identities.load_identity(credentials_dir, self._inbox_machine)
            self._tls = tls_trusting(self.settings.nats_tls_cert)  # Solo's own agent
        elif self.enrolment is not None:
            self._tls = self.enrolment.nats_tls()
        self._metrics_server = serve(
            self.metrics.registry,
            host=self.settings.metrics_host,
            port=self.settings.agent_metrics_port,
            service="agent",
            setting="EINSORA_AGENT_METRICS_PORT",
        )
        try:
            nc, closed = await self._open_on_bus()
            self._tunnel = self._make_tunnel()
            if self._tunnel is not None:
                await self._tunnel.start()
        except BaseException:
            await self.stop()
            raise
        self._session = asyncio.create_task(self._run(nc, closed), name="agent connection")
        self._reclaims = asyncio.create_task(self._watch_reclaim(), name="agent local reclaim")
        log.info(
            "agent started",
            extra={
                "machines": len(self.machines),
                "driver": self.driver_name,
                "nats": self.nats_url,
                "enrolled": self.enrolment is not None,
            },
        )

    async def _open_on_bus(self) -> tuple[NATS, asyncio.Event]:
        """Connect, then make and open every machine: the connection, and its closed event.

        Tried again, from the connection on, after each transient failure (NATS away, the
        `machines` bucket not provisioned yet, or without a leader), with capped back-off, for
        as long as it takes or until the agent is stopped: a cell's parts start in any order
        (issue 35, F5). Raises MachineRevoked, MachineUnknown, and a refused credential no wait
        can cure (a static one, which is a setting's fault)."""
        attempt = 0
        while True:
            attempt += 1
            closed = asyncio.Event()
            nc = await self._reconnect(closed, starting=True)
            self._nc = nc
            try:
                await self._open_machines(nc)
            except Exception as exc:
                if not startup.retryable(exc):
                    raise
                if attempt == 1:
                    log.warning(
                        "the agent cannot read its machines' keys; retrying with back-off",
                        extra={
                            "nats": self.nats_url,
                            "error": repr(exc),
                            "hint": f"the {names.MACHINES.name} bucket may not be provisioned "
                            "yet (einsora solo, the api and the scheduler do), or JetStream "
                            "is not available yet",
                        },
                    )
                await self._close_machines()
                await asyncio.sleep(startup.backoff(attempt, cap_s=self.backoff_max_s))
                continue
            if attempt > 1:
                log.info("the agent's machines are open", extra={"attempts": attempt})
            return nc, closed

    async def _open_machines(self, nc: NATS) -> None:
        """Make every machine on `nc`, adopt what survived, publish, watch and read."""
        js = nc.jetstream()
        if self.provision_bus:
            await provision(js, replicas=self.settings.nats_replicas)
        kv = bind_bucket(js, names.MACHINES)
        publisher: ObservedPublisher[MachineAgent] = ObservedPublisher(
            lambda: self.machines.values(), lambda m: m.put_observed(), self.heartbeat_s
        )
        self.publisher = publisher
        owner = self.enrolment.owner_tenant_id if self.enrolment is not None else None
        for machine_id in self.machine_ids:
            self.machines[machine_id] = MachineAgent(
                machine_id,
                js=js,
                kv=kv,
                drivers=self.drivers,
                inventory=await self._inventory(machine_id),
                workloads_dir=self._workloads_dir(),
                records=self._records(machine_id),
                timing=self.timing,
                on_change=publisher.mark,
                owner_tenant_id=owner,
                metrics=self.metrics,
                fence_after_s=self.fence_after_s,
            )
        publisher.start()
        await _bounded(self.machines.values(), lambda m: m.open())

    async def _close_machines(self) -> None:
        """Undo `_open_machines` and close the connection; workloads keep running."""
        await asyncio.gather(*(m.close() for m in self.machines.values()))
        if self.publisher is not None:
            await self.publisher.stop()
            self.publisher = None
        self.machines = {}
        nc, self._nc = self._nc, None
        await close_quietly(nc)

    async def stop(self) -> None:
        """Stop the agent; its workloads keep running (a restarted agent adopts them)."""
        reclaims, self._reclaims = self._reclaims, None
        if reclaims is not None:
            reclaims.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reclaims
        check, self._revocation_check = self._revocation_check, None
        if check is not None:
            check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await check
        if self._session is not None:
            self._session.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._session
            self._session = None
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            await tunnel.stop()
        await self._close_machines()
        server, self._metrics_server = self._metrics_server, None
        if server is not None:
            server.stop()

    async def wait_gone(self) -> EinsoraError:
        """Wait until the agent stops for good on its own (its machine was revoked): why."""
        await self._gone.wait()
        assert self.gone_reason is not None
        return self.gone_reason

    async def stop_workloads(self) -> None:
        """Stop every workload of every machine (directories kept), and report it. Final: no
        desired state read after it starts one again (`MachineAgent.stop_workloads`)."""
        await asyncio.gather(*(m.stop_workloads() for m in self.machines.values()))

    def unsettled(self) -> list[str]:
        """Each workload whose latest goal is not reached yet, and where it stands."""
        return [
            f"{m.machine_id}/{s.state()}"
            for m in self.machines.values()
            for s in m.supervisors.values()
            if s.busy_or_waking
        ]

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

    def _engine_drivers(self, poll_s: float) -> list[Driver]:
        """The drivers of the engines the options name (whether or not they answer now: the
        inventory lists only those that do, and each connects when it is first used)."""
        options = self.engines
        if options is None:
            return []
        found: list[Driver] = []
        if options.libvirt:
            found.append(
                LibvirtDriver(
                    VmOptions(
                        uri=options.libvirt_uri,
                        vm_dir=options.vm_dir,
                        image_dirs=options.vm_images,
                        sysfs=options.sysfs,
                        machine_id=self.machine_ids[0],
                        poll_s=poll_s,
                        workdirs=self.settings.data_dir / "workloads",
                        gpu_addresses=self._passthrough_addresses,
                        downloads=self.downloads,
                    )
                )
            )
        if options.docker:
            docker_options = DockerOptions(
                base_url=options.docker_host, machine_id=self.machine_ids[0], poll_s=poll_s
            )
            found.append(DockerDriver(docker_options))
            found.append(DockerDriver(docker_options, name=engines.DOCKER_KATA, runtime="kata"))
        return found

    def _gpus(self) -> list[Gpu]:
        """This machine's GPUs as its inventory lists them (the process driver's devices)."""
        machine = self.machines.get(self.machine_ids[0])
        return [] if machine is None else list(machine.inventory.gpus)

    def _passthrough_addresses(self) -> dict[str, str]:
        """The PCI address of each GPU a VM may be given whole, by uuid (its inventory)."""
        machine = self.machines.get(self.machine_ids[0])
        if machine is None:
            return {}
        return {
            g.uuid: g.pci_address
            for g in machine.inventory.gpus
            if g.passthrough and g.pci_address is not None
        }

    async def _inventory(self, machine_id: str) -> Inventory:
        if self.sim_machine is not None:
            return self.sim_machine.inventory(machine_id, self.region, ["sim"])
        reports = []
        if self.engines is not None:
            reports = await asyncio.to_thread(engines.probe, self.engines)
        confinement = (
            self.driver.confiner.report if isinstance(self.driver, ProcessDriver) else None
        )
        return await asyncio.to_thread(
            inventory.collect,
            machine_id,
            self.region,
            [self.driver_name],
            reports,
            gpu_file=self.settings.gpu_inventory,
            confinement=confinement,
        )

    def _workloads_dir(self) -> Path | None:
        return None if self.driver_name == "sim" else self.settings.data_dir / "workloads"

    def _records(self, machine_id: str) -> RecordStore | None:
        if self.driver_name == "sim":
            return None
        return RecordStore(self.settings.data_dir / "agent" / machine_id / "workloads")

    # --- the connection, and the agent's own reconnect loop -----------------------------------

    async def _connect(self, closed: asyncio.Event, *, report: bool) -> NATS:
        async def on_closed() -> None:
            closed.set()

        token = None
        if self._credentials is None and self.enrolment is not None:
            token = self.enrolment.credential.get_secret_value()
        return await connect(
            self.nats_url,
            name=f"einsora-agent {self._inbox_machine}",
            inbox_prefix=names.agent_inbox_prefix(self._inbox_machine),
            credentials=self._credentials,
            token=token,
            tls=self._tls,
            on_closed=on_closed,
            report_start=report,
        )

    async def _run(self, nc: NATS, closed: asyncio.Event) -> None:
        """Serve one connection until it closes without the agent asking, then make the next."""
        fresh = False
        while True:
            raise_if_cancelled()
            maintenance = asyncio.create_task(self._maintain(nc, fresh), name="agent maintenance")
            try:
                await _until_closed(nc, closed)
            finally:
                maintenance.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await maintenance
            error = str(nc.last_error or "")
            # An expired session is the routine renewal of a short-lived credential.
            log.log(
                logging.INFO if "expired" in error.lower() else logging.WARNING,
                "NATS closed the agent's connection; connecting again",
                extra={"nats": self.nats_url, "error": error},
            )
            closed = asyncio.Event()
            try:
                nc = await self._reconnect(closed)
            except MachineRevoked as exc:
                await self._give_up(exc)
                return
            self._nc = nc
            js = nc.jetstream()
            kv = bind_bucket(js, names.MACHINES)
            for machine in self.machines.values():
                await machine.rebind(js, kv)
            publisher = self.publisher
            if publisher is not None:
                # Its write in flight went out on the closed connection, whose reply can never
                # come: abandoned rather than waited out (5 s without a heartbeat), and every
                # machine reports on the new one at once.
                await publisher.stop()
                publisher.start()
            fresh = True

    async def _reconnect(self, closed: asyncio.Event, *, starting: bool = False) -> NATS:
        """Connect (again): at once (an expired session renews), then with capped, jittered
        back-off, for as long as it takes.

        A refused credential is told from an outage by asking the api. Raises MachineRevoked
        when it says the machine was revoked; at start, also MachineUnknown when it knows no
        machine by this credential, and the refusal itself for static credentials (a setting's
        fault). Anything else is waited out: NATS away, and a refusal while the api cannot be
        asked, since the api is what vouches for machines to NATS (issue 35, F4)."""
        delay = BACKOFF_MIN_S
        began = time.monotonic()
        attempts = 0
        reported = False
        while True:
            raise_if_cancelled()
            attempts += 1
            error: EinsoraError
            try:
                nc = await self._connect(closed, report=starting and attempts == 1)
            except CredentialRefused as exc:
                if self.enrolment is None:
                    if starting:
                        raise
                    error = exc  # static credentials: no api to ask; a reload may let it in
                else:
                    known = await self._standing(quiet=reported)
                    if known is join.Standing.revoked:
                        raise MachineRevoked(self.machine_id) from exc
                    if known is join.Standing.unknown and starting:
                        raise MachineUnknown(self.machine_id, self.enrolment.api_url) from exc
                    error = _refused_unsure(self.nats_url, known)
            except BusUnavailable as exc:
                error = exc
            else:
                if not starting or attempts > 1:
                    log.info(
                        "connected to NATS again" if not starting else "connected to NATS",
                        extra={
                            "attempts": attempts,
                            "after_s": round(time.monotonic() - began, 3),
                        },
                    )
                return nc
            if not reported:
                log.warning(
                    "cannot connect to NATS; retrying with back-off",
                    extra={"error": error.message, "code": error.code},
                )
                reported = True
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, self.backoff_max_s)

    async def _revoked(self, *, quiet: bool = False) -> bool:
        """Whether the api says this machine was revoked; False when it cannot tell."""
        return await self._standing(quiet=quiet) is join.Standing.revoked

    async def _standing(self, *, quiet: bool = False) -> join.Standing | None:
        """What the api says of this machine's credential; None when it cannot tell (no api to
        ask: Solo, static credentials; or the api unreachable or unsure)."""
        if self.enrolment is None:
            return None
        try:
            return await join.standing(self.enrolment)
        except EinsoraError as exc:
            if not quiet:
                log.warning(
                    "cannot ask the api whether this machine was revoked; retrying",
                    extra={"api": self.enrolment.api_url, "error": exc.message},
                )
            return None

    async def _give_up(self, reason: MachineRevoked) -> None:
        """Revoked: stop the tunnel and the workloads (the control plane failed them, and no
        agent can adopt them: joining again makes a new machine), then stop for good. Either
        way of learning it may call this; the first does the work."""
        if self.gone_reason is not None:
            return
        log.error(
            "machine revoked: the agent stops",
            extra={"machine": self.machine_id, "api": self.enrolment and self.enrolment.api_url},
        )
        self.gone_reason = reason
        tunnel, self._tunnel = self._tunnel, None
        try:
            if tunnel is not None:
                await tunnel.stop()
            await self.stop_workloads()
        finally:
            self._gone.set()

    def _make_tunnel(self) -> AgentTunnel | None:
        """The tunnel this machine's agent dials, when its enrolment names one."""
        endpoint = self.enrolment.tunnel if self.enrolment is not None else None
        if endpoint is None:
            return None
        from einsora.agent.tunnel import AgentTunnel  # asyncssh: only for tunnelled machines

        return AgentTunnel(
            address=(endpoint.host, endpoint.port),
            host_key=join.tunnel_host_key_path(self.settings.data_dir),
            hub_key=endpoint.hub_key,
            allowed_ports=self.workload_ports,
            machine_id=self.machine_id,
            on_refused=self._tunnel_refused,
        )

    def _tunnel_refused(self) -> None:
        """The hub no longer knows this machine's key. Revoked, perhaps, while the bus has not
        cut this agent off (its kick lost, or still on its way): ask the api, one question at a
        time, and stop for good if it says so. The bus's own refusal is the other way to learn
        it; whichever comes first acts."""
        if self._revocation_check is None or self._revocation_check.done():
            self._revocation_check = asyncio.create_task(
                self._check_revoked(), name="agent revocation check"
            )

    async def _check_revoked(self) -> None:
        if await self._revoked(quiet=True):
            await self._give_up(MachineRevoked(self.machine_id))

    def workload_ports(self) -> set[int]:
        """The ports this machine's workloads answer on now (what the tunnel may forward)."""
        ports: set[int] = set()
        for m in self.machines.values():
            for w in m.observed().workloads:
                if w.endpoint is not None:
                    ports.add(w.endpoint.port)
                    ports.update(w.endpoint.ports.values())  # a VM's SSH and console too
        return ports

    async def _maintain(self, nc: NATS, fresh: bool) -> None:
        """Reconnects (re-watch and re-read), periodic resync, inventory refresh. `fresh`: a new
        connection, so every machine watches, reads and reports again first."""
        signal = reconnects(nc)
        seen = signal.count
        next_resync = time.monotonic() + self.resync_s
        next_inventory = time.monotonic() + self.inventory_s
        pending: set[str] = set(self.machines) if fresh else set()
        while True:
            raise_if_cancelled()
            if pending:
                pending = await self._each(pending, _rewatch)
            if await signal.passed(seen, TICK_S):  # a reconnect cuts the tick short
                seen = signal.count
                log.info("reconnected to NATS: watching and reading desired states again")
                pending = set(self.machines)
                continue
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
            except Exception as exc:
                # Tried again at the next tick either way: what is not transient (a refused
                # permission, say) is a fault a person must see, and no reason to stop syncing.
                failed.add(m.machine_id)
                log.log(
                    logging.WARNING if is_transient(exc) else logging.ERROR,
                    "machine sync step failed; retrying",
                    extra={"machine": m.machine_id, "error": repr(exc)},
                )

        await _bounded([self.machines[i] for i in machine_ids if i in self.machines], one)
        return failed

    async def _watch_reclaim(self) -> None:
        """The owner's reclaim on the machine (`einsora agent reclaim`), read every tick,
        whether or not the bus is there: it is applied locally first, then reported. So is the
        fence (a machine cut off too long stops what may run elsewhere: fence.py). The
        workloads' phases are counted for /metrics on the same tick, every few seconds."""
        ticks = 0
        while True:
            raise_if_cancelled()
            if ticks % PHASES_EVERY_TICKS == 0:
                self.metrics.phases(
                    s.phase for m in self.machines.values() for s in m.supervisors.values()
                )
            ticks += 1
            local = reclaim.read(self.settings.data_dir)
            now = utcnow()
            for machine in self.machines.values():
                machine.apply_reclaim(local, now)
                machine.fence(time.monotonic())
            unsent = {m.machine_id for m in self.machines.values() if m.inventory_unsent}
            if unsent and self._nc is not None and self._nc.is_connected:
                # Bounded, so a bus that is away holds up no local decision; a reconnect
                # writes the inventory again anyway.
                await self._each(unsent, _put_inventory_briefly)
            await asyncio.sleep(TICK_S)

    async def _refresh_inventory(self, machine: MachineAgent) -> None:
        fresh = await self._inventory(machine.machine_id)
        # The reclaim is the owner's word here, not something collected.
        fresh = fresh.model_copy(update={"reclaimed_at": machine.inventory.reclaimed_at})
        if not inventory.same(fresh, machine.inventory):
            machine.inventory = fresh
            await machine.put_inventory()


def _refused_unsure(nats_url: str, known: join.Standing | None) -> EinsoraError:
    """A refusal of an enrolled machine's credential that the api does not explain."""
    why = (
        "the api cannot be asked"
        if known is None
        else f"the api says it is {known.value}"  # enrolled (or, running, unknown: waited out)
    )
    return EinsoraError(
        f"NATS at {shown_url(nats_url)} refused this machine's credential and {why}: the api, "
        "which vouches for machines to NATS, may be down or starting; trying again",
        code="credential_refused",
        retryable=True,
    )


async def _until_closed(nc: NATS, closed: asyncio.Event) -> None:
    """Until `nc` is closed for good: told through `closed`, or seen closed at a tick. nats-py
    closes an ended session from a task of its own, and that close can fail (writing to the
    socket the server closed) before it tells anyone; `is_closed` is set first (issue 35, F3)."""
    while not (closed.is_set() or nc.is_closed):
        raise_if_cancelled()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TICK_S):
                await closed.wait()


async def _rewatch(machine: MachineAgent) -> None:
    await machine.rewatch()
    await machine.put_inventory()
    await machine.put_observed()


async def _put_inventory_briefly(machine: MachineAgent) -> None:
    await asyncio.wait_for(machine.put_inventory(), INVENTORY_PUT_S)


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
