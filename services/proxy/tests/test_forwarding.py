"""The proxy in front of a real upstream, with routes from a real nats-server.

The upstream stands in for a workload (it is the workload, not our code); sessions are made with
the proxy's own SessionStore, as a redeemed ticket would. Ticket redemption itself is tested with
the api in tests/test_access.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import Route, WorkloadKind
from einsora.common.settings import Settings
from einsora.common.testing import Bus, until
from einsora.proxy.service import ProxyService

TOKEN = "upstream-token-" + "x" * 24
BIG = 8 * 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _upstream_app() -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": {k: v for k, v in request.headers.items() if k != "Authorization"},
                "auth_ok": request.headers.get("Authorization") == f"token {TOKEN}",
                "body_len": len(body),
            }
        )

    async def page(_: web.Request) -> web.Response:
        return web.Response(
            text=f'<script>var c = {{"token": "{TOKEN}"}};</script>', content_type="text/html"
        )

    async def cookies(_: web.Request) -> web.Response:
        resp = web.Response(text="ok")
        resp.headers.add("Set-Cookie", "mine=1; Path=/")
        resp.headers.add("Set-Cookie", "wide=1; Domain=localhost; Path=/")
        return resp

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{request.url.port}/lab/tree")

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        chunk = b"a" * 65536
        for _ in range(BIG // len(chunk)):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def upload(request: web.Request) -> web.Response:
        total = 0
        async for chunk in request.content.iter_any():
            total += len(chunk)
        return web.json_response({"received": total})

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        ok = request.headers.get("Authorization") == f"token {TOKEN}"
        await sock.send_str(f"auth_ok={ok}")
        async for msg in sock:
            if msg.type == aiohttp.WSMsgType.TEXT:
                await sock.send_str("echo:" + msg.data)
        return sock

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/page", page)
    app.router.add_get("/cookies", cookies)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/big", big)
    app.router.add_post("/upload", upload)
    app.router.add_get("/ws", ws)
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


@dataclass
class Harness:
    proxy: ProxyService
    workload_id: str
    cookie: str
    http: aiohttp.ClientSession
    bus: Bus

    @property
    def host(self) -> str:
        return f"{self.workload_id}.localhost:{self.proxy.port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Host": self.host, "Cookie": f"einsora-site={self.cookie}", **extra}


@pytest_asyncio.fixture
async def harness(bus: Bus, data_dir: object) -> AsyncIterator[Harness]:
    runner = web.AppRunner(await _upstream_app())
    await runner.setup()
    upstream_port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", upstream_port).start()
    settings = Settings(nats_url=bus.url, proxy_port=0, data_dir=data_dir)
    proxy = ProxyService(settings)
    await proxy.start()
    workload_id = new_id("workload")
    kv = await bus.js.key_value(names.ROUTES.name)
    route = Route(
        workload_id=workload_id,
        tenant_id="t-1",
        kind=WorkloadKind.notebook,
        machine_id="m-1",
        host="127.0.0.1",
        port=upstream_port,
        token=TOKEN,
    )
    await kv.put(names.route_key(workload_id), route.to_bytes())
    await until(lambda: _has_route(proxy, workload_id), within_s=5)
    cookie = proxy.sessions.create(workload_id, "t-1", "u-1")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        yield Harness(proxy, workload_id, cookie, http, bus)
    await proxy.stop()
    await runner.cleanup()


def _has_route(proxy: ProxyService, workload_id: str) -> bool:
    return proxy.route(workload_id) is not None


async def test_requests_reach_the_workload_with_its_token_and_without_ours(h: Harness) -> None:
    headers = h.headers(Authorization="Bearer tsk_users_own", **{"X-Forwarded-Host": "evil"})
    headers["Cookie"] += "; einsora_session=dashboard; theirs=kept"
    async with h.http.get(f"{h.base}/api/x?token=leak&a=1", headers=headers) as resp:
        assert resp.status == 200
        seen = await resp.json()
    assert seen["auth_ok"]  # the workload's token, not the user's
    assert "X-Forwarded-Host" not in seen["headers"]
    assert seen["headers"]["Cookie"] == "theirs=kept"  # neither our cookie nor the dashboard's
    assert seen["path"] == "/api/x?a=1"


async def test_no_cookie_no_entry(h: Harness) -> None:
    async with h.http.get(f"{h.base}/api/x", headers={"Host": h.host}) as resp:
        assert resp.status == 403
        assert TOKEN not in await resp.text()


async def test_a_cookie_of_one_site_does_not_open_another(h: Harness) -> None:
    other = new_id("workload")
    kv = await h.bus.js.key_value(names.ROUTES.name)
    route = h.proxy.route(h.workload_id)
    assert route is not None
    await kv.put(names.route_key(other), route.model_copy(update={"workload_id": other}).to_bytes())
    await until(lambda: _has_route(h.proxy, other), within_s=5)
    headers = h.headers()
    headers["Host"] = f"{other}.localhost:{h.proxy.port}"
    async with h.http.get(f"{h.base}/api/x", headers=headers) as resp:
        assert resp.status == 403


async def test_the_token_is_scrubbed_from_pages(h: Harness) -> None:
    async with h.http.get(f"{h.base}/page", headers=h.headers()) as resp:
        text = await resp.text()
    assert TOKEN not in text
    assert '"token": ""' in text


async def test_upstream_cookies_naming_a_domain_are_dropped(h: Harness) -> None:
    async with h.http.get(f"{h.base}/cookies", headers=h.headers()) as resp:
        cookies = resp.headers.getall("Set-Cookie")
    assert cookies == ["mine=1; Path=/"]


async def test_internal_redirects_are_rewritten_to_the_site(h: Harness) -> None:
    async with h.http.get(f"{h.base}/redirect", headers=h.headers(), allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == f"http://{h.host}/lab/tree"


@pytest.mark.parametrize("origin", ["http://evil.com", "null", "http://localhost:8080"])
async def test_a_foreign_origin_cannot_post(h: Harness, origin: str) -> None:
    async with h.http.post(f"{h.base}/api/x", headers=h.headers(Origin=origin), data=b"{}") as resp:
        assert resp.status == 403


async def test_a_cross_site_fetch_cannot_post(h: Harness) -> None:
    headers = h.headers(**{"Sec-Fetch-Site": "cross-site"})
    async with h.http.post(f"{h.base}/api/x", headers=headers, data=b"{}") as resp:
        assert resp.status == 403


async def test_the_sites_own_origin_can_post(h: Harness) -> None:
    origin = f"http://{h.host}"
    async with h.http.post(f"{h.base}/api/x", headers=h.headers(Origin=origin), data=b"{}") as resp:
        assert resp.status == 200


async def test_large_bodies_stream_both_ways(h: Harness) -> None:
    async with h.http.get(f"{h.base}/big", headers=h.headers()) as resp:
        total = 0
        async for chunk in resp.content.iter_any():
            total += len(chunk)
    assert total == BIG

    async def body() -> AsyncIterator[bytes]:
        for _ in range(BIG // 65536):
            yield b"b" * 65536

    origin = f"http://{h.host}"
    async with h.http.post(
        f"{h.base}/upload", headers=h.headers(Origin=origin), data=body()
    ) as resp:
        assert (await resp.json())["received"] == BIG


async def test_websockets_are_bridged_and_closed_when_the_route_goes(h: Harness) -> None:
    origin = f"http://{h.host}"
    async with h.http.ws_connect(f"{h.base}/ws", headers=h.headers(Origin=origin)) as sock:
        hello = await sock.receive_str(timeout=5)
        assert hello == "auth_ok=True"
        await sock.send_str("1+1")
        assert await sock.receive_str(timeout=5) == "echo:1+1"
        kv = await h.bus.js.key_value(names.ROUTES.name)
        await kv.delete(names.route_key(h.workload_id))
        msg = await sock.receive(timeout=5)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    async with h.http.get(f"{h.base}/api/x", headers=h.headers()) as resp:
        assert resp.status == 404  # no route: refused at once


async def test_a_websocket_from_a_foreign_origin_is_refused(h: Harness) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await h.http.ws_connect(f"{h.base}/ws", headers=h.headers(Origin="http://evil.com"))
    assert refused.value.status == 403


async def test_an_absolute_uri_is_refused(h: Harness) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.proxy.port)
    writer.write(
        f"GET http://evil.com/ HTTP/1.1\r\nHost: {h.host}\r\n"
        f"Cookie: einsora-site={h.cookie}\r\nConnection: close\r\n\r\n".encode()
    )
    await writer.drain()
    status = await reader.readline()
    writer.close()
    assert b" 400 " in status


async def test_sites_without_a_route_answer_404(h: Harness) -> None:
    headers = h.headers()
    headers["Host"] = f"{new_id('workload')}.localhost:{h.proxy.port}"
    async with h.http.get(f"{h.base}/", headers=headers) as resp:
        assert resp.status == 404


@pytest.fixture
def h(harness: Harness) -> Harness:
    return harness
