"""Workload traffic through the tunnel an agent dialed (ADR-0015), with real parts only.

A real nats-server holds the enrolments and routes; the proxy runs its real tunnel hub; a real
`AgentTunnel` dials it; a real aiohttp server on 127.0.0.1 stands in for the workload. Where a
test needs a hub that misbehaves (asking for a shell, another host, or holding another key), it
is a real asyncssh SSH client built for the test, never a mock of the agent or the hub.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncssh
import pytest
import pytest_asyncio
from aiohttp import web

from einsora.agent.runtimes.sim_server import SimEndpointServer
from einsora.agent.tunnel import AgentTunnel, make_host_key
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import Enrolment, Route, WorkloadKind, utcnow
from einsora.common.settings import Settings
from einsora.common.testing import Bus, until
from einsora.common.tunnel_clients import socket_path
from einsora.gateway.testing import harness as gateway_harness
from einsora.proxy.service import ProxyService

log = logging.getLogger("test.tunnel")

TOKEN = "tunnel-token-" + "y" * 24
BIG = 8 * 1024 * 1024


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A data dir with a short path: a unix socket's path may not pass 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="et-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Upstream:
    """The workload: echo, a stream the test paces, a large body, a WebSocket echo."""

    port: int
    go: asyncio.Event


@pytest_asyncio.fixture
async def upstream() -> AsyncIterator[Upstream]:
    go = asyncio.Event()

    async def echo(request: web.Request) -> web.Response:
        ok = request.headers.get("Authorization") == f"token {TOKEN}"
        return web.json_response({"path": request.path_qs, "auth_ok": ok})

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # A comment after the event: the proxy holds back a token's length of a stream's tail
        # (to scrub a token split across chunks), so the event itself is not held.
        await resp.write(b"data: first\n\n:" + b" " * 64 + b"\n")
        await go.wait()  # the rest only once the client has seen the first event
        await resp.write(b"data: second\n\n")
        await resp.write_eof()
        return resp

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(BIG // 65536):
            await resp.write(bytes([i % 256]) * 65536)
        await resp.write_eof()
        return resp

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            if msg.type == aiohttp.WSMsgType.TEXT:
                await sock.send_str("echo:" + msg.data)
        return sock

    app = web.Application()
    app.router.add_get("/stream", stream)
    app.router.add_get("/big", big)
    app.router.add_get("/ws", ws)
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield Upstream(runner.addresses[0][1], go)
    go.set()
    await runner.cleanup()


@dataclass
class Rig:
    """A proxy with its hub, one enrolled tunnelled machine, and a route to the upstream."""

    bus: Bus
    data_dir: Path
    proxy: ProxyService
    machine_id: str
    host_key: Path
    workload_id: str
    cookie: str
    upstream: Upstream
    http: aiohttp.ClientSession
    agents: list[AgentTunnel]

    def headers(self, **extra: str) -> dict[str, str]:
        host = f"{self.workload_id}.localhost:{self.proxy.port}"
        return {"Host": host, "Cookie": f"einsora-site={self.cookie}", **extra}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    @property
    def hub_port(self) -> int:
        assert self.proxy.hub is not None
        return self.proxy.hub.port

    def agent(self, host_key: Path | None = None, hub_key: str | None = None) -> AgentTunnel:
        assert self.proxy.hub is not None
        agent = AgentTunnel(
            ("127.0.0.1", self.hub_port),
            host_key or self.host_key,
            hub_key or self.proxy.hub.public_key,
            lambda: {self.upstream.port},
            machine_id=self.machine_id,
            retry_first_s=0.05,
            retry_cap_s=0.5,
        )
        self.agents.append(agent)
        return agent

    async def enrol(self, *, revoked: bool = False) -> None:
        enrolment = Enrolment(
            machine_id=self.machine_id,
            owner_tenant_id="t-1",
            region="local",
            tunnel=True,
            tunnel_key=make_host_key(self.host_key),
            revoked_at=utcnow() if revoked else None,
        )
        kv = await self.bus.js.key_value(names.ENROLMENTS.name)
        await kv.put(names.enrolment_key(self.machine_id), enrolment.to_bytes())

    def socket(self) -> Path:
        return socket_path(
            self.data_dir / "tunnel" / "sockets", self.machine_id, self.upstream.port
        )

    async def get(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.url + path, headers=self.headers()) as resp:
            return resp.status, await resp.text()


def _settings(bus: Bus, data_dir: Path, tunnel_port: int = 0) -> Settings:
    return Settings(nats_url=bus.url, proxy_port=0, tunnel_port=tunnel_port, data_dir=data_dir)


@pytest_asyncio.fixture
async def rig(bus: Bus, short_dir: Path, upstream: Upstream) -> AsyncIterator[Rig]:
    proxy = ProxyService(_settings(bus, short_dir))
    await proxy.start()
    machine_id = new_id("machine")
    workload_id = new_id("workload")
    route = Route(
        workload_id=workload_id,
        tenant_id="t-1",
        kind=WorkloadKind.notebook,
        machine_id=machine_id,
        host="127.0.0.1",
        port=upstream.port,
        token=TOKEN,
        via_tunnel=True,
    )
    kv = await bus.js.key_value(names.ROUTES.name)
    await kv.put(names.route_key(workload_id), route.to_bytes())
    await until(lambda: proxy.route(workload_id) is not None, what="the proxy has the route")
    made = Rig(
        bus=bus,
        data_dir=short_dir,
        proxy=proxy,
        machine_id=machine_id,
        host_key=short_dir / "agent" / "tunnel_host_key",
        workload_id=workload_id,
        cookie=proxy.sessions.create(workload_id, "t-1", "u-1"),
        upstream=upstream,
        http=aiohttp.ClientSession(),
        agents=[],
    )
    try:
        yield made
    finally:
        for agent in made.agents:
            await agent.stop()
        await made.http.close()
        await made.proxy.stop()


async def _connected(rig: Rig, agent: AgentTunnel) -> None:
    await agent.start()
    await asyncio.wait_for(agent.connected.wait(), 15)
    await until(rig.socket().exists, what="the hub serves the route's socket")


async def test_http_streaming_and_websockets_pass_through_the_tunnel(rig: Rig) -> None:
    await rig.enrol()
    await _connected(rig, rig.agent())
    assert rig.proxy.hub is not None
    assert rig.proxy.hub.connected(rig.machine_id)
    for folder in (rig.socket().parent, rig.socket().parent.parent):
        assert folder.stat().st_mode & 0o077 == 0  # only this user reaches the sockets

    async with rig.http.get(rig.url + "/api/x?token=leak", headers=rig.headers()) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body == {"path": "/api/x", "auth_ok": True}  # the proxy's cleaning, unchanged

    async with rig.http.get(rig.url + "/stream", headers=rig.headers()) as resp:
        assert await resp.content.readuntil(b"\n\n") == b"data: first\n\n"
        rig.upstream.go.set()  # the first event came through before the upstream finished
        assert (await resp.content.read()).endswith(b"\ndata: second\n\n")

    async with rig.http.get(rig.url + "/big", headers=rig.headers()) as resp:
        data = await resp.read()
    assert len(data) == BIG
    assert all(data[i * 65536] == i % 256 for i in range(BIG // 65536))

    origin = f"http://{rig.workload_id}.localhost:{rig.proxy.port}"
    async with rig.http.ws_connect(rig.url + "/ws", headers=rig.headers(Origin=origin)) as ws:
        for i in range(20):
            await ws.send_str(f"m{i}")
            assert await ws.receive_str(timeout=10) == f"echo:m{i}"


async def test_a_host_key_that_is_not_enrolled_is_refused(rig: Rig, short_dir: Path) -> None:
    await rig.enrol()
    stranger = rig.agent(host_key=short_dir / "stranger" / "key")
    assert rig.proxy.hub is not None
    refused_before = rig.proxy.hub.refusals
    await stranger.start()
    await until(lambda: rig.proxy.hub is not None and rig.proxy.hub.refusals > refused_before)
    assert not stranger.connected.is_set()
    assert not rig.proxy.hub.connected(rig.machine_id)
    assert not rig.socket().exists()
    status, text = await rig.get("/")
    assert (status, text.strip()) == (502, f"{rig.machine_id}'s tunnel is not connected.")


@pytest.mark.parametrize("how", ["revoked", "deleted"])
async def test_revocation_cuts_the_tunnel_and_refuses_its_reconnects(rig: Rig, how: str) -> None:
    await rig.enrol()
    agent = rig.agent()
    await _connected(rig, agent)
    origin = f"http://{rig.workload_id}.localhost:{rig.proxy.port}"
    ws = await rig.http.ws_connect(rig.url + "/ws", headers=rig.headers(Origin=origin))
    await ws.send_str("before")
    assert await ws.receive_str(timeout=10) == "echo:before"
    assert rig.proxy.hub is not None
    refused_before = rig.proxy.hub.refusals

    t0 = time.perf_counter()
    if how == "revoked":
        await rig.enrol(revoked=True)
    else:
        kv = await rig.bus.js.key_value(names.ENROLMENTS.name)
        await kv.delete(names.enrolment_key(rig.machine_id))
    await until(lambda: not agent.connected.is_set(), what="the agent saw its tunnel cut")
    log.info("tunnel cut %.1f ms after the enrolment was %s", (time.perf_counter() - t0) * 1e3, how)

    msg = await ws.receive(timeout=10)  # the open WebSocket went with the tunnel
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
    await ws.close()
    assert not rig.proxy.hub.connected(rig.machine_id)
    await until(lambda: not rig.socket().exists(), what="the socket is gone")
    status, text = await rig.get("/")
    assert (status, text.strip()) == (502, f"{rig.machine_id}'s tunnel is not connected.")
    # The agent keeps dialing (it cannot tell revocation from a network failure here; the bus
    # tells it): each attempt is refused at the handshake.
    await until(lambda: rig.proxy.hub is not None and rig.proxy.hub.refusals > refused_before + 1)
    assert not agent.connected.is_set()
    assert not rig.proxy.hub.connected(rig.machine_id)


async def test_the_agent_reconnects_after_the_hub_restarts(rig: Rig, bus: Bus) -> None:
    await rig.enrol()
    agent = rig.agent()
    await _connected(rig, agent)
    port = rig.hub_port
    await rig.proxy.stop()
    await until(lambda: not agent.connected.is_set(), what="the agent saw the hub go")

    # The same data dir keeps the hub's key (the agent's pin), and the same port.
    rig.proxy = ProxyService(_settings(bus, rig.data_dir, tunnel_port=port))
    await rig.proxy.start()
    rig.cookie = rig.proxy.sessions.create(rig.workload_id, "t-1", "u-1")
    await asyncio.wait_for(agent.connected.wait(), 15)
    await until(rig.socket().exists, what="the new hub serves the route's socket")
    status, text = await rig.get("/again")
    assert status == 200
    assert '"auth_ok": true' in text


async def test_a_tunnelled_endpoint_is_reached_by_the_gateway(rig: Rig, bus: Bus) -> None:
    async def start_sim(model: str, options: object) -> SimEndpointServer:
        server = SimEndpointServer(model, None)
        await server.start()
        return server

    await rig.enrol()
    async with gateway_harness(bus.js, bus.url, rig.data_dir, start_sim, None) as gw:
        sim = await start_sim("tunnelled-model", None)
        gw.servers.append(sim)
        route = Route(
            workload_id=new_id("workload"),
            tenant_id=gw.tenant,
            kind=WorkloadKind.endpoint,
            machine_id=rig.machine_id,
            host="127.0.0.1",
            port=sim.port,
            name="tunnelled-model",
            runtime="sim",
            via_tunnel=True,
        )
        kv = await bus.js.key_value(names.ROUTES.name)
        await kv.put(names.route_key(route.workload_id), route.to_bytes())
        await until(lambda: route in gw.gateway.models.replicas(gw.tenant, "tunnelled-model"))
        secret, _ = await gw.key()
        ask = {"model": "tunnelled-model", "messages": [{"role": "user", "content": "hi"}]}
        url = f"http://127.0.0.1:{gw.gateway.port}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {secret}"}

        async with rig.http.post(url, json=ask, headers=auth) as resp:
            down = await resp.json()
        assert resp.status == 502
        assert down["error"]["code"] == "tunnel_not_connected"
        assert rig.machine_id in down["error"]["message"]

        agent = AgentTunnel(
            ("127.0.0.1", rig.hub_port),
            rig.host_key,
            rig.proxy.hub.public_key if rig.proxy.hub else "",
            lambda: {sim.port},
            machine_id=rig.machine_id,
            retry_first_s=0.05,
        )
        rig.agents.append(agent)
        await agent.start()
        await asyncio.wait_for(agent.connected.wait(), 15)
        sim_socket = socket_path(rig.data_dir / "tunnel" / "sockets", rig.machine_id, sim.port)
        await until(sim_socket.exists, what="the hub serves the endpoint's socket")
        async with rig.http.post(url, json=ask, headers=auth) as resp:
            answer = await resp.json()
        assert resp.status == 200, answer
        assert answer["choices"][0]["message"]["content"]
        assert sim.requests >= 1


# The agent alone, against SSH clients made for the test: a compromised or impostor hub.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class FakeHubEnd:
    """What a hand-made reverse listener saw: the connection it got, or why it got none."""

    conn: asyncio.Future[asyncssh.SSHClientConnection]
    acceptor: asyncssh.SSHAcceptor


async def _hand_made_hub(key: asyncssh.SSHKey) -> FakeHubEnd:
    loop = asyncio.get_running_loop()
    got: asyncio.Future[asyncssh.SSHClientConnection] = loop.create_future()

    def accepted(conn: asyncssh.SSHClientConnection) -> None:
        if not got.done():
            got.set_result(conn)

    def failed(_: object, exc: Exception) -> None:
        if not got.done():
            got.set_exception(exc)

    acceptor = await asyncssh.listen_reverse(
        "127.0.0.1",
        0,
        acceptor=accepted,
        error_handler=failed,
        config=None,
        username="x",
        client_keys=[key],
        known_hosts=None,  # this hub trusts any agent: only the agent's checks are under test
        agent_path=None,
        gss_host=None,
    )
    return FakeHubEnd(got, acceptor)


async def test_the_agent_refuses_a_hub_key_it_does_not_pin(short_dir: Path) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    pinned = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    hub = await _hand_made_hub(impostor)
    agent = AgentTunnel(
        ("127.0.0.1", hub.acceptor.get_port()),
        short_dir / "key",
        pinned,
        lambda: {1234},
        machine_id="m-impostor-test",
        retry_first_s=0.05,
    )
    await agent.start()
    try:
        with pytest.raises(asyncssh.PermissionDenied):
            await asyncio.wait_for(hub.conn, 15)
        assert not agent.connected.is_set()
    finally:
        await agent.stop()
        hub.acceptor.close()


async def test_the_agent_allows_only_its_workloads_ports_on_loopback(
    short_dir: Path, upstream: Upstream
) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    hub = await _hand_made_hub(key)
    agent = AgentTunnel(
        ("127.0.0.1", hub.acceptor.get_port()),
        short_dir / "key",
        key.export_public_key().decode(),
        lambda: {upstream.port},
        machine_id="m-allow-test",
    )
    await agent.start()
    try:
        conn = await asyncio.wait_for(hub.conn, 15)
        for host in ("127.0.0.1", "localhost"):  # a workload's port on loopback: allowed
            reader, writer = await conn.open_connection(host, upstream.port)
            writer.write(b"GET /ok HTTP/1.0\r\nHost: x\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.0 200")
            writer.close()
        closed = _free_port()  # not a workload's: refused even though nothing listens
        for host, port in [
            ("127.0.0.1", closed),
            ("10.255.255.1", upstream.port),
            ("::1", upstream.port),
            ("example.com", 443),
        ]:
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.open_connection(host, port)
        with pytest.raises(asyncssh.ChannelOpenError):  # no shell, no exec, no SFTP
            await conn.run("id", check=True)
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.start_sftp_client()
        with pytest.raises(asyncssh.ChannelListenError):  # no listener on the agent's side
            await conn.forward_remote_port("127.0.0.1", 0, "127.0.0.1", upstream.port)
        assert agent.connected.is_set()  # refusals leave the tunnel itself up
    finally:
        await agent.stop()
        hub.acceptor.close()


async def test_a_route_is_refused_for_the_control_planes_ports_and_for_too_many(
    rig: Rig, bus: Bus
) -> None:
    # Issue 34, N1 and N3 (ADR-0026): whatever wrote the route, the proxy does not follow one
    # to its own ports or the bus's, and the hub opens no socket per port of a route that
    # names thousands of them.
    await rig.enrol()
    await _connected(rig, rig.agent())
    kv = await bus.js.key_value(names.ROUTES.name)
    nats_port = int(bus.url.rsplit(":", 1)[1])

    def route(port: int, **ports: int) -> Route:
        return Route(
            workload_id=new_id("workload"),
            tenant_id="t-1",
            kind=WorkloadKind.vm,
            machine_id=rig.machine_id,
            host="127.0.0.1",
            port=port,
            via_tunnel=True,
            ports=ports,
        )

    own = route(rig.proxy.port)
    bus_port = route(45000, ssh=nats_port)
    many = route(45001, **{f"p{i}": 46000 + i for i in range(4000)})
    fine = route(45002, ssh=45003)
    for r in (own, bus_port, many, fine):
        await kv.put(names.route_key(r.workload_id), r.to_bytes())
    await until(lambda: rig.proxy.route(fine.workload_id) is not None, what="the fine route")
    for refused in (own, bus_port, many):
        assert rig.proxy.route(refused.workload_id) is None
    sockets = rig.data_dir / "tunnel" / "sockets"
    await until(
        lambda: socket_path(sockets, rig.machine_id, 45003).exists(), what="the fine route's ssh"
    )
    # The first route's socket, and the fine one's two: nothing for the four thousand.
    assert len(list(sockets.rglob("*"))) <= 8
