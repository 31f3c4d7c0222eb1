"""A VM's site on the proxy: its console page, the console's socket relayed with the workload's
token (which its web UI never receives), and `/_einsora/ssh` as the bytes of one TCP connection.

Stand-ins for the VM's side (a web UI, a console relay that checks the token, an SSH port that
echoes) are real servers on loopback; routes come from a real nats-server, sessions from the
proxy's own SessionStore, as a redeemed ticket would make them.
"""

from __future__ import annotations

import asyncio
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

TOKEN = "vm-token-" + "y" * 24


async def _vm_side() -> tuple[web.AppRunner, asyncio.Server, int, int, int]:
    async def web_ui(request: web.Request) -> web.Response:
        return web.json_response({"authorization": request.headers.get("Authorization")})

    async def relay(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"token {TOKEN}":
            return web.Response(status=403)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(b"tty:" + msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/_einsora/console/ws", relay)
    app.router.add_route("*", "/{tail:.*}", web_ui)
    runner = web.AppRunner(app)
    await runner.setup()
    ui = web.TCPSite(runner, "127.0.0.1", 0)
    await ui.start()
    console = web.TCPSite(runner, "127.0.0.1", 0)
    await console.start()
    ports = [int(a[1]) for a in runner.addresses]

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-stand-in\r\n")
        while data := await reader.read(1024):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    ssh = await asyncio.start_server(echo, "127.0.0.1", 0)
    ssh_port = int(ssh.sockets[0].getsockname()[1])
    return runner, ssh, ports[0], ports[1], ssh_port


@dataclass
class VmSite:
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

    async def route(self, **ports: int) -> None:
        kv = await self.bus.js.key_value(names.ROUTES.name)
        main = ports.get("http", ports["console"])
        route = Route(
            workload_id=self.workload_id,
            tenant_id="t-1",
            kind=WorkloadKind.vm,
            machine_id="m-1",
            host="127.0.0.1",
            port=main,
            token=TOKEN,
            ports=ports,
        )
        await kv.put(names.route_key(self.workload_id), route.to_bytes())
        await until(lambda: self.proxy.route(self.workload_id) == route, within_s=5)


@pytest_asyncio.fixture
async def vm(bus: Bus, data_dir: object) -> AsyncIterator[tuple[VmSite, dict[str, int]]]:
    runner, ssh, ui_port, console_port, ssh_port = await _vm_side()
    proxy = ProxyService(Settings(nats_url=bus.url, proxy_port=0, data_dir=data_dir))
    await proxy.start()
    workload_id = new_id("workload")
    cookie = proxy.sessions.create(workload_id, "t-1", "u-1")
    ports = {"http": ui_port, "console": console_port, "ssh": ssh_port}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        site = VmSite(proxy, workload_id, cookie, http, bus)
        await site.route(**ports)
        yield site, ports
    await proxy.stop()
    ssh.close()
    await runner.cleanup()


async def test_the_console_socket_gets_the_token_and_the_web_ui_does_not(
    vm: tuple[VmSite, dict[str, int]],
) -> None:
    site, _ = vm
    async with site.http.get(f"{site.base}/anything", headers=site.headers()) as resp:
        assert resp.status == 200
        assert (await resp.json())["authorization"] is None
    async with site.http.get(f"{site.base}/_einsora/console", headers=site.headers()) as resp:
        assert resp.status == 200
        page = await resp.text()
        assert "/_einsora/console/console.js" in page
        assert site.workload_id in page
    async with site.http.ws_connect(
        f"{site.base}/_einsora/console/ws", headers=site.headers(Origin=f"http://{site.host}")
    ) as ws:
        await ws.send_bytes(b"ls\r")
        msg = await ws.receive()
        assert msg.data == b"tty:ls\r"


async def test_ssh_is_one_tcp_connection_inside_a_websocket(
    vm: tuple[VmSite, dict[str, int]],
) -> None:
    site, _ = vm
    async with site.http.ws_connect(
        f"{site.base}/_einsora/ssh", headers=site.headers(Origin=f"http://{site.host}")
    ) as ws:
        greeting = await ws.receive()
        assert greeting.data == b"SSH-2.0-stand-in\r\n"
        await ws.send_bytes(b"hello")
        assert (await ws.receive()).data == b"HELLO"


async def test_the_sockets_need_the_sites_session_and_origin(
    vm: tuple[VmSite, dict[str, int]],
) -> None:
    site, _ = vm
    for path in ("/_einsora/ssh", "/_einsora/console/ws"):
        for headers in (
            {"Host": site.host, "Origin": f"http://{site.host}"},  # no session
            site.headers(Origin="http://evil.localhost"),  # another site's page
        ):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await site.http.ws_connect(f"{site.base}{path}", headers=headers)
            assert refused.value.status == 403


async def test_a_vm_without_a_web_ui_opens_at_its_console(
    vm: tuple[VmSite, dict[str, int]],
) -> None:
    site, ports = vm
    await site.route(console=ports["console"], ssh=ports["ssh"])
    async with site.http.get(
        f"{site.base}/", headers=site.headers(), allow_redirects=False
    ) as resp:
        assert resp.status == 303
        assert resp.headers["Location"] == "/_einsora/console"


async def test_every_port_of_a_tunnelled_vm_gets_a_forward(
    vm: tuple[VmSite, dict[str, int]],
) -> None:
    site, ports = vm
    kv = await site.bus.js.key_value(names.ROUTES.name)
    route = site.proxy.route(site.workload_id)
    assert route is not None
    tunnelled = route.model_copy(update={"via_tunnel": True})
    await kv.put(names.route_key(site.workload_id), tunnelled.to_bytes())
    await until(lambda: site.proxy.route(site.workload_id) == tunnelled, within_s=5)
    assert {("m-1", p) for p in ports.values()} <= site.proxy.tunnelled_forwards()
