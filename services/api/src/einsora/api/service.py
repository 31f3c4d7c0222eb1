"""ApiService: the control API as one service, the way Solo and `einsora api` run it.

`start()` applies the migrations, makes the owner on the first start (with a one-time sign-in
link to the dashboard), connects to NATS and provisions it, starts the timeline consumer, the
gateway keys' last use (`consumers/key_use.py`), the machines view, the outbox relay and
anti-entropy (which provisions again if NATS comes back empty, and republishes lost intents;
ADR-0011), the gateway keys sync (KV `gateway_keys` equal to the store's live keys), the
tenant quotas sync (the `quota.*` keys of KV `usage` equal to the store's quotas), the
enrolments sync (KV `enrolments` equal to the store's machines), the activity log's retention
(entries older than `activity_retention_days` purged, at start and every
`activity_purge_period_s`) and, where the server runs
one, the auth callout for machines' credentials (`bus_auth.py`), then
serves HTTP with uvicorn in this process, event streams included (`consumers/streams.py`), each
request's head bounded in size and time (`protocols.py`), and returns once it accepts connections.
`stop()` ends the event streams first, then undoes all the rest, in reverse, and may be called
twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable, Generator
from datetime import datetime
from functools import partial
from pathlib import Path

import uvicorn
from nats.aio.client import Client as NATS

from einsora.api.anti_entropy import ANTI_ENTROPY_PERIOD_S, AntiEntropy
from einsora.api.app import create_app
from einsora.api.auth import VerifiedTokens
from einsora.api.bootstrap import OWNER_TOKEN_FILE, ensure_owner
from einsora.api.bus_auth import MachineBusAuth
from einsora.api.consumers.key_use import KeyUseConsumer
from einsora.api.consumers.outbox import OutboxRelay
from einsora.api.consumers.redeemer import TicketRedeemer
from einsora.api.consumers.revocations import Revocations
from einsora.api.consumers.streams import EventStreams
from einsora.api.consumers.timeline import TimelineConsumer
from einsora.api.context import ApiContext
from einsora.api.metrics import ApiMetrics, metrics_app
from einsora.api.projections.enrolments import EnrolmentsSync
from einsora.api.projections.gateway_keys import GatewayKeysSync
from einsora.api.projections.model_fallbacks import ModelFallbacksSync
from einsora.api.projections.quotas import QuotasSync
from einsora.api.protocols import MAX_HEAD_BYTES, edge_protocol
from einsora.api.services.activity import PURGE_PERIOD_S, ActivityRetention
from einsora.api.services.sign_in_links import mint_owner_link
from einsora.api.services.usage import Accounting
from einsora.api.store import Store
from einsora.api.trusted_proxies import forwarded_allow_ips
from einsora.api.views.machines import MachinesView
from einsora.api.views.regions import RegionsView
from einsora.common import startup
from einsora.common.bus import close_quietly, connect_as, identities, provision, tls_trusting
from einsora.common.bus.provision import ALL_BUT_ROUTES
from einsora.common.catalog import Catalog
from einsora.common.errors import PortInUse
from einsora.common.schemas import utcnow
from einsora.common.settings import Settings

log = logging.getLogger("einsora.api")


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the process's owner (Solo, the command) has them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class ApiService:
    """The control API: REST `/v1`, the store, the outbox relay and the timeline consumer."""

    name = "api"

    def __init__(
        self,
        settings: Settings,
        *,
        catalog: Catalog | None = None,
        port: int | None = None,
        host: str | None = None,
        clock: Callable[[], datetime] = utcnow,
        anti_entropy_period_s: float = ANTI_ENTROPY_PERIOD_S,
        activity_purge_period_s: float = PURGE_PERIOD_S,
    ) -> None:
        self.settings = settings
        self.catalog = catalog or Catalog.load(settings.catalog)
        self.clock = clock
        self._redeemer: TicketRedeemer | None = None
        self._revocations: Revocations | None = None
        self.tokens: VerifiedTokens | None = None
        """The API tokens this replica verified lately (once started)."""
        self._wanted_port = settings.api_port if port is None else port
        self._host = host or settings.bind_host
        self.port: int | None = None
        """The port it listens on once started (the chosen one when asked for port 0)."""
        self.owner_token_created: str | None = None
        """The owner's token secret when this start made the owner, else None."""
        self.owner_sign_in_path: str | None = None
        """The owner's one-time sign-in link (a path on the dashboard's origin, the code in its
        fragment) when this start made the owner, else None."""
        self.store: Store | None = None
        self.nc: NATS | None = None
        self.relay: OutboxRelay | None = None
        self._timeline: TimelineConsumer | None = None
        self._key_use: KeyUseConsumer | None = None
        self._anti_entropy_period_s = anti_entropy_period_s
        self.anti_entropy: AntiEntropy | None = None
        self.gateway_keys: GatewayKeysSync | None = None
        """Keeps KV `gateway_keys` equal to the live gateway keys (once started)."""
        self.quotas: QuotasSync | None = None
        """Keeps the `quota.*` keys of KV `usage` equal to the tenants' quotas (once started)."""
        self.enrolments: EnrolmentsSync | None = None
        """Keeps KV `enrolments` equal to the store's machines (once started)."""
        self.model_fallbacks: ModelFallbacksSync | None = None
        """Keeps KV `model_fallbacks` equal to the live endpoints' model steps (ADR-0022)."""
        self._activity_purge_period_s = activity_purge_period_s
        self.activity_retention: ActivityRetention | None = None
        """Purges the activity log's entries past their retention (once started)."""
        self.bus_auth: MachineBusAuth | None = None
        """The auth callout for machines' credentials, where the server runs one."""
        self._machines = MachinesView(self.catalog)
        self._regions = RegionsView()
        self.streams: EventStreams | None = None
        """The open event streams (SSE) of this replica (once started)."""
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self.metrics_port: int | None = None
        """The port /metrics listens on once started, when `api_metrics_port` is set."""
        self._metrics_server: _Server | None = None
        self._metrics_serving: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """`http://host:port` of the running api."""
        return f"http://{self._host}:{self.port}"

    @property
    def owner_token_path(self) -> Path:
        return self.settings.data_dir / OWNER_TOKEN_FILE

    async def start(self) -> None:
        sock = _bind(self._host, self._wanted_port)
        try:
            self.store = Store(self.settings.effective_database_url)
            await self.store.migrate()
            self.owner_token_created = await ensure_owner(self.store, self.settings.data_dir)
            if self.owner_token_created is not None:
                # The owner's first way into the dashboard: a one-time link (ADR-0019).
                link = await mint_owner_link(self.store, self._now())
                self.owner_sign_in_path = None if link is None else link.path
            # Each first call to the bus waits out a transient failure (issue 35, F5); the
            # loops started below keep trying by themselves.
            self.nc = await startup.retrying(
                "connecting to NATS",
                lambda: connect_as(
                    self.settings.effective_nats_url,
                    identities.API,
                    self.settings.nats_credentials_dir,
                    tls=tls_trusting(self.settings.nats_tls_cert),
                ),
                service=self.name,
            )
            js = self.nc.jetstream()
            await startup.retrying(
                "provisioning the bus",
                lambda: provision(js, replicas=self.settings.nats_replicas, only=ALL_BUT_ROUTES),
                service=self.name,
            )
            metrics = ApiMetrics()
            self._timeline = TimelineConsumer(
                self.store,
                js,
                registry=metrics.registry,
                ack_wait_s=self.settings.api_timeline_ack_wait_s,
            )
            await startup.retrying(
                "declaring the timeline's consumer", self._timeline.start, service=self.name
            )
            self._key_use = KeyUseConsumer(self.store, js, registry=metrics.registry)
            await startup.retrying(
                "declaring the key use consumer", self._key_use.start, service=self.name
            )
            await self._machines.start(self.nc, js)
            await self._regions.start(self.nc, js)
            self.relay = OutboxRelay(self.store, self.nc, js, registry=metrics.registry)
            await self.relay.start()
            self.anti_entropy = AntiEntropy(
                self.store,
                self.nc,
                js,
                timeline=self._timeline,
                period_s=self._anti_entropy_period_s,
                replicas=self.settings.nats_replicas,
            )
            await self.anti_entropy.start()
            self.gateway_keys = GatewayKeysSync(self.store, self.nc, js, clock=self._now)
            await self.gateway_keys.start()
            self.quotas = QuotasSync(self.store, self.nc, js)
            await self.quotas.start()
            self.enrolments = EnrolmentsSync(self.store, self.nc, js, view=self._machines)
            await self.enrolments.start()
            self.model_fallbacks = ModelFallbacksSync(self.store, self.nc, js)
            await self.model_fallbacks.start()
            self.activity_retention = ActivityRetention(
                self.store,
                retention_days=self.settings.activity_retention_days,
                clock=self._now,
                period_s=self._activity_purge_period_s,
            )
            await self.activity_retention.start()
            credentials_dir = self.settings.nats_credentials_dir
            if credentials_dir is not None and MachineBusAuth.wanted(credentials_dir):
                self.bus_auth = MachineBusAuth(self.store)
                await startup.retrying(
                    "serving the auth callout",
                    partial(self._start_bus_auth, self.bus_auth, credentials_dir),
                    service=self.name,
                )
            self._redeemer = TicketRedeemer(self.store, self.nc, clock=self._now)
            await self._redeemer.start()
            tokens = self.tokens = VerifiedTokens()
            self._revocations = Revocations(tokens)
            await self._revocations.start(self.nc)
            nc = self.nc
            self.streams = EventStreams(
                self.store,
                js,
                heartbeat_s=self.settings.api_stream_heartbeat_s,
                per_account=self.settings.api_streams_per_token,
            )
            ctx = ApiContext(
                settings=self.settings,
                store=self.store,
                catalog=self.catalog,
                machines=self._machines,
                regions=self._regions,
                bus_connected=lambda: nc.is_connected,
                clock=self._now,
                metrics=metrics,
                tokens=tokens,
                revocations=self._revocations,
                model_fallbacks=self.model_fallbacks,
                gateway_keys=self.gateway_keys,  # the key routes write KV through it
                quotas=self.quotas,  # the quota routes too
                enrolments=self.enrolments,  # joins and revocations
                bus_auth=self.bus_auth,  # revocations cut the machine's connections
                accounting=Accounting(self.nc),  # usage reports ask accounting
                streams=self.streams,
            )
            await self._serve_metrics(ctx.metrics)
            app = create_app(ctx)
            config = uvicorn.Config(
                app,
                # httptools where installed, else h11, each head bounded in size and time, with
                # the api's JSON answer to what it cannot parse; the edge middleware refuses what
                # it lets through but must not serve.
                http=edge_protocol(self.settings.api_header_timeout_s),
                h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                lifespan="off",
                access_log=False,
                log_config=None,
                server_header=False,
                # X-Forwarded-* only from the proxies the operator named (issue 34, N5).
                forwarded_allow_ips=forwarded_allow_ips(self.settings),
                timeout_graceful_shutdown=5,
            )
            self._server = _Server(config)
            self.port = sock.getsockname()[1]
            self._serving = asyncio.create_task(self._server.serve([sock]), name="api http")
            await _started(self._server, self._serving)
        except BaseException:
            sock.close()
            await self.stop()
            raise
        log.info("api listening", extra={"url": self.url})

    def _now(self) -> datetime:
        # Looked up at each call, so a test can swap `clock` on a running service.
        return self.clock()

    async def _start_bus_auth(self, bus_auth: MachineBusAuth, credentials_dir: Path) -> None:
        """Start the auth callout; a start that failed half-way is undone, to be tried again."""
        try:
            await bus_auth.start(
                self.settings.effective_nats_url,
                credentials_dir,
                tls_trusting(self.settings.nats_tls_cert),
            )
        except BaseException:
            await bus_auth.stop()
            raise

    async def _serve_metrics(self, metrics: ApiMetrics) -> None:
        """Prometheus /metrics on a port of its own (loopback by default), when one is set."""
        port, host = self.settings.api_metrics_port, self.settings.metrics_host
        if port is None:
            return
        try:
            sock = _bind(host, port)
        except PortInUse as exc:
            raise PortInUse(
                f"cannot serve metrics on {host}:{port}: the port is taken; choose another "
                "with EINSORA_API_METRICS_PORT"
            ) from exc
        config = uvicorn.Config(
            metrics_app(metrics), lifespan="off", access_log=False, log_config=None
        )
        self._metrics_server = _Server(config)
        self.metrics_port = sock.getsockname()[1]
        self._metrics_serving = asyncio.create_task(
            self._metrics_server.serve([sock]), name="api metrics http"
        )
        try:
            await _started(self._metrics_server, self._metrics_serving)
        except BaseException:
            sock.close()
            raise
        log.info("api metrics listening", extra={"url": f"http://{host}:{self.metrics_port}"})

    async def stop(self) -> None:
        if self.streams is not None:
            # First: an open stream would hold uvicorn's graceful shutdown for its whole length.
            await self.streams.close()
            self.streams = None
        servers = [(self._server, self._serving), (self._metrics_server, self._metrics_serving)]
        self._server = self._serving = None
        self._metrics_server = self._metrics_serving = None
        for server, serving in servers:
            if server is not None and serving is not None:
                server.should_exit = True
                with contextlib.suppress(Exception):
                    await serving
        if self._redeemer is not None:
            await self._redeemer.stop()
            self._redeemer = None
        if self._revocations is not None:
            await self._revocations.stop()
            self._revocations = None
        if self.bus_auth is not None:
            await self.bus_auth.stop()
            self.bus_auth = None
        if self.activity_retention is not None:
            await self.activity_retention.stop()
            self.activity_retention = None
        if self.enrolments is not None:
            await self.enrolments.stop()
            self.enrolments = None
        if self.model_fallbacks is not None:
            await self.model_fallbacks.stop()
            self.model_fallbacks = None
        if self.quotas is not None:
            await self.quotas.stop()
            self.quotas = None
        if self.gateway_keys is not None:
            await self.gateway_keys.stop()
            self.gateway_keys = None
        if self.anti_entropy is not None:
            await self.anti_entropy.stop()
            self.anti_entropy = None
        if self.relay is not None:
            await self.relay.stop()
            self.relay = None
        await self._machines.stop()
        await self._regions.stop()
        if self._timeline is not None:
            await self._timeline.stop()
            self._timeline = None
        if self._key_use is not None:
            await self._key_use.stop()
            self._key_use = None
        await close_quietly(self.nc)
        self.nc = None
        if self.store is not None:
            await self.store.close()
            self.store = None


async def _started(server: uvicorn.Server, serving: asyncio.Task[None]) -> None:
    """Return once `server` accepts connections; raise if it stopped instead."""
    while not server.started:
        if serving.done():
            serving.result()
            raise RuntimeError("the HTTP server stopped while starting")
        await asyncio.sleep(0.01)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a taken port is a clear PortInUse."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and without
    # it every response on a kept-alive connection waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise PortInUse(
                f"cannot listen on {host}:{port}: the port is taken; choose another with "
                "--port or EINSORA_API_PORT"
            ) from exc
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock
