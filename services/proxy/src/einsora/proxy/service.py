"""ProxyService: the access proxy as a service Solo or `einsora proxy` runs.

It also runs the tunnel hub (ADR-0015), fed by two mirrors: the enrolments (which machine holds
which tunnel key, and which are revoked) and the routes (which tunnelled ports need a socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp
from aiohttp import web
from nats.aio.client import Client as NATS
from pydantic import ValidationError

from einsora.common import startup
from einsora.common.aiohttp_edge import client_trace_configs
from einsora.common.bus import (
    KvMirror,
    close_quietly,
    connect_as,
    identities,
    names,
    provision,
    tls_trusting,
)
from einsora.common.http_guard import GuardedAppRunner
from einsora.common.metrics import MetricsServer, serve
from einsora.common.schemas import Enrolment, Route
from einsora.common.settings import Settings
from einsora.common.targets import OwnPorts
from einsora.common.tunnel_clients import TunnelClients
from einsora.proxy.app import ProxyState, create_app, plain_response
from einsora.proxy.metrics import ProxyMetrics
from einsora.proxy.routes import AUDIT_S, RouteTable
from einsora.proxy.sessions import Clock, SessionStore
from einsora.proxy.sites import SiteConfig
from einsora.proxy.tunnels import Forward, TunnelHub

log = logging.getLogger("einsora.proxy")

MAX_FORWARDS_PER_MACHINE = 256
"""The most unix sockets the hub opens for one machine's tunnelled routes (each route names at
most `routes.MAX_PORTS` besides its own): a machine cannot make the hub open sockets at will."""


class _Routes(RouteTable):
    """The route table, also telling the tunnel hub when its tunnelled routes change."""

    def __init__(
        self,
        on_removed: Callable[[str], object],
        on_changed: Callable[[], None],
        own_ports: OwnPorts,
    ):
        super().__init__(on_removed, own_ports=own_ports)
        self._on_changed = on_changed

    def tunnelled(self) -> set[Forward]:
        """Each tunnelled route's ports (a VM's SSH and console too), at most
        `MAX_FORWARDS_PER_MACHINE` a machine: the hub opens a socket for each."""
        forwards: set[Forward] = set()
        per_machine: dict[str, int] = {}
        for r in self._routes.values():
            if not r.via_tunnel:
                continue
            ports = {r.port, *r.ports.values()}
            taken = per_machine.get(r.machine_id, 0)
            if taken + len(ports) > MAX_FORWARDS_PER_MACHINE:
                log.warning(
                    "a machine's tunnelled routes name too many ports; some not served",
                    extra={"machine_id": r.machine_id, "most": MAX_FORWARDS_PER_MACHINE},
                )
                continue
            per_machine[r.machine_id] = taken + len(ports)
            forwards.update((r.machine_id, port) for port in ports)
        return forwards

    def _put(self, key: str, value: bytes) -> None:
        super()._put(key, value)
        self._on_changed()

    def _delete(self, key: str) -> None:
        super()._delete(key)
        self._on_changed()


class ProxyService:
    """Serves `w-<id>.<domain>:<port>` for every running workload."""

    name = "proxy"

    def __init__(
        self,
        settings: Settings,
        *,
        idle_s: float = 12 * 3600,
        clock: Clock | None = None,
    ) -> None:
        self._settings = settings
        # The same Settings-built names as the api's links (proxy_domain, proxy_tls).
        self.sites = SiteConfig.from_settings(settings)
        self.sessions = (
            SessionStore(idle_s=idle_s, clock=clock) if clock else SessionStore(idle_s=idle_s)
        )
        self._nc: NATS | None = None
        self._client: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._routes: RouteTable | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.port: int = settings.proxy_port
        self.enrolments: dict[str, Enrolment] = {}
        self._enrolment_mirror: KvMirror | None = None
        self._enrolment_sync: asyncio.Task[None] | None = None
        self._tunnels: TunnelClients | None = None
        self.hub: TunnelHub | None = None
        self.metrics = ProxyMetrics(lambda: len(self.sessions))
        self._metrics_server: MetricsServer | None = None

    @property
    def metrics_port(self) -> int | None:
        """Where /metrics listens once started, when `proxy_metrics_port` is set."""
        return None if self._metrics_server is None else self._metrics_server.port

    async def start(self) -> None:
        # NATS away, or its JetStream not answering yet, is waited out (issue 35, F5).
        self._nc = await startup.retrying(
            "connecting to NATS",
            lambda: connect_as(
                self._settings.effective_nats_url,
                identities.PROXY,
                self._settings.nats_credentials_dir,
                tls=tls_trusting(self._settings.nats_tls_cert),
            ),
            service=self.name,
        )
        js = self._nc.jetstream()
        await startup.retrying(
            "provisioning the routes bucket",
            lambda: provision(
                js, replicas=self._settings.nats_replicas, only=(names.ROUTES.stream,)
            ),
            service=self.name,
        )
        data = self._settings.data_dir / "tunnel"
        routes = _Routes(
            on_removed=self.sessions.end_site,
            on_changed=self._routes_changed,
            own_ports=OwnPorts.of(self._settings, self.port),
        )
        self._routes = routes
        self.hub = TunnelHub(
            host=self._settings.tunnel_host or self._settings.bind_host,
            port=self._settings.tunnel_port,
            client_key=data / "hub_key",
            tunnel_dir=self._settings.effective_tunnel_sockets_dir,
            enrolments=lambda: self.enrolments,
            forwards=routes.tunnelled,
        )
        nc = self._nc

        async def follow_routes() -> None:
            try:
                await routes.start(nc, js, replicas=self._settings.nats_replicas)
            except BaseException:
                await routes.stop()  # its mirror kept trying: the next try starts another
                raise

        await startup.retrying("reading the routes", follow_routes, service=self.name)
        self._enrolment_mirror = KvMirror(
            self._nc,
            js,
            names.ENROLMENTS,
            on_put=self._enrolment_put,
            on_delete=self._enrolment_deleted,
            audit_s=AUDIT_S,
        )
        # Not awaited: the api provisions the bucket, and in Solo it starts after the proxy.
        # Until the enrolments are read the hub knows no machine, so it lets no tunnel in.
        self._enrolment_sync = asyncio.create_task(
            self._enrolment_mirror.start(sync_timeout_s=None), name="enrolments mirror"
        )
        try:
            await self.hub.start()
        except Exception:
            await self.stop()
            raise
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=None)
        self._client = aiohttp.ClientSession(
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=client_trace_configs(),
        )
        self._tunnels = TunnelClients(self._settings.effective_tunnel_sockets_dir, timeout)
        state = ProxyState(
            self.sites,
            self._routes,
            self.sessions,
            self._nc,
            self._client,
            self._tunnels,
            metrics=self.metrics,
        )
        self._metrics_server = serve(
            self.metrics.registry,
            host=self._settings.metrics_host,
            port=self._settings.proxy_metrics_port,
            service="proxy",
            setting="EINSORA_PROXY_METRICS_PORT",
        )
        # Guarded: a request that fails is answered and logged without quoting its bytes.
        self._runner = GuardedAppRunner(
            create_app(state),
            answer=plain_response,
            what="access proxy",
            logger="einsora.proxy.http",
            access_log=None,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._settings.bind_host, self._settings.proxy_port)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        if sockets:  # port 0: learn the chosen one
            self.port = sockets[0].getsockname()[1]
            self.sites = self.sites.on_port(self.port)
            state.sites = self.sites
        hub_port = None if self.hub is None else self.hub.port
        routes.own_ports = routes.own_ports.with_ports(self.port, hub_port)
        self._sweeper = asyncio.create_task(self._sweep(), name="proxy idle sweep")
        log.info("proxy serving", extra={"port": self.port, "domain": self.sites.domain})

    def _routes_changed(self) -> None:
        if self.hub is not None:
            self.hub.forwards_changed()

    def _enrolment_put(self, key: str, value: bytes) -> None:
        try:
            self.enrolments[key] = Enrolment.from_bytes(value)
        except ValidationError:
            # Treated as gone: a tunnel let in on an enrolment we cannot read is not safe.
            log.warning("unreadable enrolment ignored", extra={"machine": key})
            self.enrolments.pop(key, None)
        if self.hub is not None:
            self.hub.refresh()

    def _enrolment_deleted(self, key: str) -> None:
        self.enrolments.pop(key, None)
        if self.hub is not None:
            self.hub.refresh()

    def route(self, workload_id: str) -> Route | None:
        """Where a workload answers, as this proxy knows it now (None: its site answers 404)."""
        return self._routes.get(workload_id) if self._routes is not None else None

    def tunnelled_forwards(self) -> set[Forward]:
        """The (machine, port) pairs the tunnel hub serves a socket for (every port of every
        tunnelled route: a VM's SSH and console too)."""
        return self._routes.tunnelled() if isinstance(self._routes, _Routes) else set()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(60)
            self.sessions.expire_idle()

    async def stop(self) -> None:
        server, self._metrics_server = self._metrics_server, None
        if server is not None:
            server.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.hub is not None:
            await self.hub.stop()
            self.hub = None
        if self._enrolment_sync is not None:
            self._enrolment_sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._enrolment_sync
            self._enrolment_sync = None
        if self._enrolment_mirror is not None:
            await self._enrolment_mirror.stop()
            self._enrolment_mirror = None
        if self._routes is not None:
            await self._routes.stop()
            self._routes = None
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._tunnels is not None:
            await self._tunnels.close()
            self._tunnels = None
        await close_quietly(self._nc)
        self._nc = None
