"""The proxy's route table across a NATS restart: new routes are served, deleted ones revoke.

Session revocation depends on the proxy hearing of every deleted route, so the table must keep
following the bucket after the server restarts, with its store kept or lost. The upstream
stands in for a workload; sessions are made with the proxy's SessionStore, as a redeemed
ticket would (ticket redemption is tested with the api in tests/test_access.py).
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nats.errors
import pytest
import pytest_asyncio
from aiohttp import web
from nats.aio.client import Client as NATS

from einsora.common.bus import connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import Route, WorkloadKind
from einsora.common.settings import Settings
from einsora.common.testing import until
from einsora.proxy.service import ProxyService


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Setup:
    proxy: ProxyService
    nc: NATS
    http: aiohttp.ClientSession
    upstream_port: int

    async def put_route(self, workload_id: str) -> None:
        js = self.nc.jetstream()
        # The scheduler's part: a restarted server without its store gets the bucket again
        # (retried, as the scheduler does, while a restarted server's JetStream comes up).
        for attempt in range(5):
            try:
                await provision(js, only=(names.ROUTES.stream,))
                break
            except nats.errors.TimeoutError:
                if attempt == 4:
                    raise
        kv = await js.key_value(names.ROUTES.name)
        route = Route(
            workload_id=workload_id,
            tenant_id="t-1",
            kind=WorkloadKind.notebook,
            machine_id="m-1",
            host="127.0.0.1",
            port=self.upstream_port,
            token="upstream-token-" + "y" * 24,
        )
        await kv.put(names.route_key(workload_id), route.to_bytes())

    async def delete_route(self, workload_id: str) -> None:
        kv = await self.nc.jetstream().key_value(names.ROUTES.name)
        await kv.delete(names.route_key(workload_id))

    async def status(self, workload_id: str, cookie: str) -> int:
        headers = {
            "Host": f"{workload_id}.localhost:{self.proxy.port}",
            "Cookie": f"einsora-site={cookie}",
        }
        async with self.http.get(f"http://127.0.0.1:{self.proxy.port}/x", headers=headers) as r:
            return r.status


@pytest_asyncio.fixture
async def setup(own_nats_server: EmbeddedNats, data_dir: Path) -> AsyncIterator[Setup]:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello from the workload")

    upstream = web.Application()
    upstream.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(upstream)
    await runner.setup()
    upstream_port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", upstream_port).start()
    proxy = ProxyService(Settings(nats_url=own_nats_server.url, proxy_port=0, data_dir=data_dir))
    await proxy.start()
    nc = await connect(own_nats_server.url, name="scheduler-stand-in")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        yield Setup(proxy, nc, http, upstream_port)
    await nc.close()
    await proxy.stop()
    await runner.cleanup()


@pytest.mark.parametrize("store", ["kept", "lost"])
async def test_the_route_table_survives_a_nats_restart(
    setup: Setup, own_nats_server: EmbeddedNats, store: str
) -> None:
    proxy = setup.proxy
    before = new_id("workload")
    await setup.put_route(before)
    await until(lambda: proxy.route(before) is not None, within_s=20)
    before_cookie = proxy.sessions.create(before, "t-1", "u-1")
    assert await setup.status(before, before_cookie) == 200

    own_nats_server.stop()
    if store == "lost":
        shutil.rmtree(own_nats_server.data_dir / "jetstream")
    own_nats_server.start()

    # A route written after the restart is served.
    after = new_id("workload")
    await until(lambda: setup.nc.is_connected, within_s=20)
    await setup.put_route(after)
    await until(lambda: proxy.route(after) is not None, within_s=20)
    after_cookie = proxy.sessions.create(after, "t-1", "u-1")
    assert await setup.status(after, after_cookie) == 200

    # A route deleted after the restart ends its sessions.
    await setup.delete_route(after)
    await until(lambda: proxy.route(after) is None, within_s=20)
    assert proxy.sessions.get(after_cookie, after) is None
    assert await setup.status(after, after_cookie) == 404

    if store == "kept":
        assert await setup.status(before, before_cookie) == 200
    else:
        # The restarted server has no route for it any more: that too ends its sessions.
        assert proxy.route(before) is None
        assert proxy.sessions.get(before_cookie, before) is None
