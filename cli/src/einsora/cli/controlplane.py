"""Every service of Einsora in one process, in order: what Solo runs, and what end-to-end tests
start on free ports.

Order: NATS first, then the proxy (so the api's access links name its real port), the api
(which owns the store and creates the owner), the scheduler, accounting, the gateway, and last
the agent; stopping goes in reverse, so the agent stops watching before the scheduler goes
away. The services still talk only over NATS.

A service that does not stop within STOP_S is left behind, named with where it waits, and the
rest still stop: Solo's Ctrl-C and a test's teardown end rather than hang on one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from einsora.accounting.service import AccountingService
from einsora.agent import identity as machine_identity
from einsora.agent.service import AgentService, DriverName
from einsora.api.bootstrap import owner_tenant_id
from einsora.api.service import ApiService
from einsora.api.services.machines import enrol_own
from einsora.common.bus import accounts, identities
from einsora.common.embedded_nats import EmbeddedNats, port_is_free
from einsora.common.errors import PortInUse
from einsora.common.files import make_private
from einsora.common.service import Service
from einsora.common.settings import Settings
from einsora.gateway.service import GatewayService
from einsora.proxy.service import ProxyService
from einsora.scheduler.service import SchedulerService

log = logging.getLogger("einsora.solo")

STOP_S = 30.0
"""How long one service may take to stop before it is left behind."""


def check_files(settings: Settings) -> None:
    """Refuse to start when the catalog file or the GPU inventory file named is not valid,
    before anything listens (a ConfigError naming the file and what is wrong)."""
    from einsora.agent import nvml
    from einsora.common.catalog import Catalog

    if settings.catalog is not None:
        Catalog.load(settings.catalog)
    if settings.gpu_inventory is not None:
        nvml.load(settings.gpu_inventory)


def check_ports(settings: Settings) -> None:
    """Refuse to start when a port is taken, naming the port and the flag that changes it."""
    wanted: list[tuple[int, str, str]] = [
        (settings.api_port, "API and dashboard", "--api-port or EINSORA_API_PORT"),
        (settings.proxy_port, "access proxy", "--proxy-port or EINSORA_PROXY_PORT"),
        (settings.gateway_port, "inference gateway", "--gateway-port or EINSORA_GATEWAY_PORT"),
        (settings.tunnel_port, "tunnel hub", "EINSORA_TUNNEL_PORT"),
    ]
    if settings.nats_url is None:
        wanted.append((settings.nats_port, "embedded NATS", "--nats-port or EINSORA_NATS_PORT"))
    for port, what, flag in wanted:
        if port and not port_is_free(settings.bind_host, port):
            raise PortInUse(
                f"port {port} ({what}) is already in use on {settings.bind_host}; "
                f"choose another with {flag}, or stop what uses it"
            )


class ControlPlane:
    """NATS (unless external), api, scheduler, accounting, proxy, gateway and an agent for this
    machine."""

    def __init__(
        self,
        settings: Settings,
        *,
        agent_driver: DriverName = "process",
        agent_options: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.nats: EmbeddedNats | None = None
        self._agent_driver = agent_driver
        self._agent_options = agent_options or {}
        if settings.nats_url is None:
            # Every client of our own server authenticates (ADR-0009): each service, and this
            # machine's agent, gets an identity of its own, made once and kept in the data dir.
            credentials = settings.data_dir / "bus"
            make_private(settings.data_dir)
            tls = None
            if settings.nats_tls_cert is not None and settings.nats_tls_key is not None:
                tls = (settings.nats_tls_cert, settings.nats_tls_key)
            self.nats = EmbeddedNats(
                settings.data_dir / "nats",
                port=settings.nats_port,
                host=settings.nats_listen or "127.0.0.1",
                authorization=self._authorization(credentials),
                app_account=accounts.APP_ACCOUNT,
                tls=tls,
            )
            self.settings = settings.model_copy(update={"nats_credentials_dir": credentials})
        self.api: ApiService | None = None
        self.scheduler: SchedulerService | None = None
        self.proxy: ProxyService | None = None
        self.gateway: GatewayService | None = None
        self.accounting: AccountingService | None = None
        self.agent: AgentService | None = None
        self._started: list[Service] = []
        self.stuck: list[str] = []
        """Services `stop()` left behind, each with where its stop waited."""

    def _authorization(self, credentials: Path) -> str:
        """The server's users: the services Solo runs, and the agent with its machines' keys."""
        users = {
            name: (
                identities.ensure_identity(credentials, name),
                identities.service_permissions(name),
            )
            for name in (
                identities.API,
                identities.SCHEDULER,
                identities.PROXY,
                identities.GATEWAY,
                identities.ACCOUNTING,
            )
        }
        agent, machines = self._agent_identity(), self._own_machine_ids()
        users[agent] = (
            identities.ensure_identity(credentials, agent),
            identities.agent_permissions(agent, machines),
        )
        # The accounts layout, always: the services and this agent are static users; machines
        # that join from elsewhere get their sessions from the api's auth callout (issue 14).
        return accounts.server_auth_conf(
            users,
            callout=identities.ensure_identity(credentials, identities.CALLOUT),
            system=identities.ensure_identity(credentials, identities.SYSTEM),
            issuer_public_key=identities.ensure_issuer(credentials).public_key,
        )

    @property
    def nats_url(self) -> str:
        return self.nats.url if self.nats is not None else self.settings.effective_nats_url

    @property
    def api_port(self) -> int:
        if self.api is not None and self.api.port is not None:
            return self.api.port
        return self.settings.api_port

    @property
    def owner_token_created(self) -> str | None:
        return self.api.owner_token_created if self.api is not None else None

    @property
    def owner_sign_in_path(self) -> str | None:
        """The owner's one-time dashboard sign-in link (a path) when this start made the owner."""
        return self.api.owner_sign_in_path if self.api is not None else None

    async def start(self) -> None:
        # Before anything writes there: the store, credentials and tokens are ours alone.
        make_private(self.settings.data_dir)
        if self.nats is not None:
            self.nats.start()
            # Services connect to the server we started, on this host; machines elsewhere to
            # the address it listens on.
            scheme = "tls" if self.nats.tls is not None else "nats"
            listen = self.settings.nats_listen
            wildcard = listen in ("0.0.0.0", "::")  # noqa: S104 (a comparison)
            here = listen if listen and not wildcard else "127.0.0.1"
            update: dict[str, Any] = {"nats_url": f"{scheme}://{here}:{self.nats.port}"}
            if listen:
                advertised = socket.getfqdn() if wildcard else listen
                update["agent_nats_url"] = f"{scheme}://{advertised}:{self.nats.port}"
                update["bind_host"] = listen
            self.settings = self.settings.model_copy(update=update)
        s = self.settings
        # The proxy first: the api's access links name the port it really listens on.
        self.proxy = ProxyService(s)
        await self._start(self.proxy)
        if s.proxy_port == 0:
            s = s.model_copy(update={"proxy_port": self.proxy.port})
        if s.tunnel_port == 0 and self.proxy.hub is not None:
            # Join replies name the port the hub really listens on.
            s = s.model_copy(update={"tunnel_port": self.proxy.hub.port})
        self.api = ApiService(s)
        await self._start(self.api)
        if s.api_port == 0:
            s = s.model_copy(update={"api_port": self.api_port})
        assert self.api.store is not None
        owner = await owner_tenant_id(self.api.store)
        if s.machine_owner_tenant is None:
            # This machine is the owner's: weak isolation (`process`) runs its tenant only.
            s = s.model_copy(update={"machine_owner_tenant": owner})
        if self._agent_driver == "sim":
            # The operator chose a sim agent: this cell allows sim machines (issue 34, N9).
            s = s.model_copy(update={"sim_machines": True})
        self.settings = s
        if owner is not None:  # api.start() made the owner, so it is always there
            await self._enrol_own_machines(owner)
        self.scheduler = SchedulerService(s)
        await self._start(self.scheduler)
        self.accounting = AccountingService(s)
        await self._start(self.accounting)
        self.gateway = GatewayService(s)
        await self._start(self.gateway)
        if s.gateway_port == 0:
            s = s.model_copy(update={"gateway_port": self.gateway.port})
            self.settings = s
        self.agent = AgentService(s, driver=self._agent_driver, **self._agent_options)
        await self._start(self.agent)

    async def _enrol_own_machines(self, owner: str) -> None:
        """This machine (and a sim agent's machines) are the owner's, reached directly: enrolled
        before the scheduler starts, so it counts them from its first read."""
        assert self.api is not None
        assert self.api.store is not None
        enrolled = await enrol_own(
            self.api.store,
            self._own_machine_ids(),
            owner_tenant_id=owner,
            region=self.settings.region,
            hostname=socket.gethostname(),
        )
        if self.api.enrolments is not None:
            for enrolment in enrolled:
                await self.api.enrolments.put(enrolment)

    def _agent_identity(self) -> str:
        """The agent's bus identity: its (first) machine's id, or a sim agent's base id."""
        return machine_identity.resolve_machine_id(
            self.settings.data_dir, self._agent_options.get("machine_id")
        )

    def _own_machine_ids(self) -> list[str]:
        return machine_identity.sim_machine_ids(
            self._agent_identity(), self._agent_options.get("sim_machines", 1)
        )

    async def _start(self, service: Service) -> None:
        await service.start()
        self._started.append(service)
        log.info("service started", extra={"service": service.name})

    def running_workloads(self) -> int:
        return self.agent.running_count() if self.agent is not None else 0

    async def stop(self) -> None:
        """Stop every service, newest first; `stuck` names those left behind (and where)."""
        for service in reversed(self._started):
            stopping = asyncio.ensure_future(service.stop())
            # Not wait_for: cancelling a stop that swallows its cancel would hang here again.
            await asyncio.wait({stopping}, timeout=STOP_S)
            if not stopping.done():
                where = "".join(traceback.format_list(_awaiting(stopping)))
                self.stuck.append(f"{service.name}, waiting at:\n{where}")
                log.error(
                    "service did not stop in time; leaving it",
                    extra={"service": service.name, "after_s": STOP_S, "where": where},
                )
                stopping.cancel()
                continue
            if not stopping.cancelled() and stopping.exception() is not None:
                log.error(
                    "service did not stop cleanly",
                    extra={"service": service.name},
                    exc_info=stopping.exception(),
                )
        self._started.clear()
        if self.nats is not None:
            with contextlib.suppress(Exception):
                self.nats.stop()


def _awaiting(task: asyncio.Future[None]) -> traceback.StackSummary:
    """Where a task's coroutine chain waits, outermost first."""
    frames: list[tuple[Any, int]] = []
    coro: Any = task.get_coro() if isinstance(task, asyncio.Task) else None
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(iter(frames))


__all__: Sequence[str] = ("ControlPlane", "check_files", "check_ports")
