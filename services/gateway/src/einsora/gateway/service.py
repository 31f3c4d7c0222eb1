"""GatewayService: the inference gateway as a service Solo or `einsora gateway` runs."""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from nats.aio.client import Client as NATS

from einsora.common import startup
from einsora.common.aiohttp_edge import (
    client_trace_configs,
    counting_middleware,
    tracing_middlewares,
)
from einsora.common.bus import close_quietly, connect_as, identities, names, provision, tls_trusting
from einsora.common.errors import PortInUse
from einsora.common.http_guard import GuardedAppRunner
from einsora.common.metrics import MetricsServer, serve
from einsora.common.settings import Settings
from einsora.common.targets import OwnPorts
from einsora.common.tunnel_clients import TunnelClients
from einsora.gateway.app import GatewayState, create_app
from einsora.gateway.balance import Balancer
from einsora.gateway.counting import Counter
from einsora.gateway.errors import INVALID_REQUEST, SERVER, error_response
from einsora.gateway.fallbacks import ModelFallbacks
from einsora.gateway.forward import Forwarder
from einsora.gateway.keys import KeyTable
from einsora.gateway.limits import LimitBook
from einsora.gateway.metrics import GatewayMetrics, api_of
from einsora.gateway.routes import ModelTable
from einsora.gateway.usage import UsagePublisher

log = logging.getLogger("einsora.gateway")

CONNECT_S = 3.0
"""How long a replica may take to accept a connection before the next one is tried."""
READ_S = 600.0
"""How long a replica may stay silent mid-answer (a long prompt's first token included)."""
LIMITS_TIMEOUT_S = 2.0
SYNC_TIMEOUT_S = 10.0


class GatewayService:
    """Serves OpenAI's API for every tenant's endpoints on `bind_host:gateway_port`.

    `clock` (Unix seconds) decides rate-limit minutes and key expiry; tests pin it.
    """

    name = "gateway"

    def __init__(self, settings: Settings, *, clock: Callable[[], float] | None = None) -> None:
        self._settings = settings
        self._clock = clock or time.time
        self._nc: NATS | None = None
        self._client: aiohttp.ClientSession | None = None
        self._tunnels: TunnelClients | None = None
        self._runner: web.AppRunner | None = None
        self.keys = KeyTable(self._clock)
        self.models = ModelTable(own_ports=OwnPorts.of(settings))
        self.fallbacks = ModelFallbacks()
        self._limits: LimitBook | None = None
        self.usage: UsagePublisher | None = None
        self.port: int = settings.gateway_port
        self.metrics = GatewayMetrics(lambda: self.usage.pending if self.usage else 0)
        self._metrics_server: MetricsServer | None = None

    @property
    def metrics_port(self) -> int | None:
        """Where /metrics listens once started, when `gateway_metrics_port` is set."""
        return None if self._metrics_server is None else self._metrics_server.port

    async def start(self) -> None:
        # NATS away, or its JetStream not answering yet, is waited out (issue 35, F5); the
        # mirrors below keep trying by themselves.
        self._nc = await startup.retrying(
            "connecting to NATS",
            lambda: connect_as(
                self._settings.effective_nats_url,
                identities.GATEWAY,
                self._settings.nats_credentials_dir,
                tls=tls_trusting(self._settings.nats_tls_cert),
            ),
            service=self.name,
        )
        js = self._nc.jetstream()
        await startup.retrying(
            "provisioning the limits bucket",
            lambda: provision(
                js, replicas=self._settings.nats_replicas, only=(names.GATEWAY_LIMITS.stream,)
            ),
            service=self.name,
        )
        await self.keys.start(self._nc, js, sync_timeout_s=SYNC_TIMEOUT_S)
        await self.models.start(self._nc, js, sync_timeout_s=SYNC_TIMEOUT_S)
        await self.fallbacks.start(self._nc, js, sync_timeout_s=SYNC_TIMEOUT_S)
        self._limits = LimitBook(self._nc.jetstream(timeout=LIMITS_TIMEOUT_S), self._clock)
        self.usage = UsagePublisher(js, on_record=self.metrics.counted)
        self.usage.start()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S, sock_read=READ_S)
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=client_trace_configs(),
        )
        # The proxy's tunnel hub serves these sockets on this host (ADR-0015).
        self._tunnels = TunnelClients(self._settings.effective_tunnel_sockets_dir, timeout)
        state = GatewayState(
            keys=self.keys,
            models=self.models,
            limits=self._limits,
            counter=Counter(self._client, tunnels=self._tunnels),
            forwarder=Forwarder(self._client, Balancer(), self._tunnels),
            usage=self.usage,
            clock=self._clock,
            fallbacks=self.fallbacks,
        )
        # Guarded: a request that fails is answered and logged without quoting its bytes.
        self._runner = GuardedAppRunner(
            create_app(state, middlewares=gateway_middlewares(self.metrics)),
            answer=_error_answer,
            what="gateway",
            logger="einsora.gateway.http",
            access_log=None,
            shutdown_timeout=5.0,
        )
        self._metrics_server = serve(
            self.metrics.registry,
            host=self._settings.metrics_host,
            port=self._settings.gateway_metrics_port,
            service="gateway",
            setting="EINSORA_GATEWAY_METRICS_PORT",
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._settings.bind_host, self._settings.gateway_port)
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(
                    f"cannot listen on {self._settings.bind_host}:{self._settings.gateway_port}: "
                    "the port is taken; choose another with --port or EINSORA_GATEWAY_PORT"
                ) from exc
            raise
        sockets = getattr(site._server, "sockets", None)
        if sockets:  # port 0: learn the chosen one
            self.port = sockets[0].getsockname()[1]
        self.models.own_ports = self.models.own_ports.with_ports(self.port)
        log.info("gateway serving", extra={"port": self.port})

    async def stop(self) -> None:
        server, self._metrics_server = self._metrics_server, None
        if server is not None:
            server.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.usage is not None:
            await self.usage.stop()
        if self._limits is not None:
            await self._limits.stop()
            self._limits = None
        await self.keys.stop()
        await self.models.stop()
        await self.fallbacks.stop()
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._tunnels is not None:
            await self._tunnels.close()
            self._tunnels = None
        await close_quietly(self._nc)
        self._nc = None
        await asyncio.sleep(0)


def gateway_middlewares(metrics: GatewayMetrics) -> list[Any]:
    """Tracing (when on), then the requests' count."""
    return [*tracing_middlewares(), counting_middleware(metrics.requests, api_of)]


def _error_answer(status: int, text: str, request_id: str) -> web.StreamResponse:
    """A request that failed before the gateway's handlers, answered in OpenAI's error shape."""
    kind = INVALID_REQUEST if status < 500 else SERVER
    return error_response(status, text, request_id, code=None, type_=kind)
