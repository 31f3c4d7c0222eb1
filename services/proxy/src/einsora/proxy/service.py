"""ProxyService: the access proxy as a service Solo or `einsora proxy` runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import web
from nats.aio.client import Client as NATS

from einsora.common.bus import connect_as, identities, names, provision
from einsora.common.schemas import Route
from einsora.common.settings import Settings
from einsora.proxy.app import ProxyState, create_app
from einsora.proxy.protocol import GuardedAppRunner
from einsora.proxy.routes import RouteTable
from einsora.proxy.sessions import Clock, SessionStore
from einsora.proxy.sites import SiteConfig

log = logging.getLogger("einsora.proxy")


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

    async def start(self) -> None:
        self._nc = await connect_as(
            self._settings.effective_nats_url,
            identities.PROXY,
            self._settings.nats_credentials_dir,
        )
        js = self._nc.jetstream()
        await provision(js, only=(names.ROUTES.stream,))
        self._routes = RouteTable(on_removed=self.sessions.end_site)
        await self._routes.start(self._nc, js)
        self._client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=None),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        state = ProxyState(self.sites, self._routes, self.sessions, self._nc, self._client)
        # Guarded: a request that fails is answered and logged without quoting its bytes.
        self._runner = GuardedAppRunner(create_app(state), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._settings.bind_host, self._settings.proxy_port)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        if sockets:  # port 0: learn the chosen one
            self.port = sockets[0].getsockname()[1]
            self.sites = self.sites.on_port(self.port)
            state.sites = self.sites
        self._sweeper = asyncio.create_task(self._sweep(), name="proxy idle sweep")
        log.info("proxy serving", extra={"port": self.port, "domain": self.sites.domain})

    def route(self, workload_id: str) -> Route | None:
        """Where a workload answers, as this proxy knows it now (None: its site answers 404)."""
        return self._routes.get(workload_id) if self._routes is not None else None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(60)
            self.sessions.expire_idle()

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._routes is not None:
            await self._routes.stop()
            self._routes = None
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._nc is not None:
            await self._nc.close()
            self._nc = None
