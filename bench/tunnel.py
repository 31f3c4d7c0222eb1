"""The dial-out tunnel's cost (ADR-0015): through it versus straight to the same upstream, and
the floor of the candidate it was chosen over, streams over NATS.

Four processes: the upstream (a few bytes at `/`, 200 MB at `/big`, a WebSocket echo), the
agent's `AgentTunnel`, the load generator, and this one with a real nats-server, the proxy and
its tunnel hub. The same load runs over each path in one sitting:
- direct: TCP to the upstream;
- tunnel: the hub's unix socket for the route (asyncssh's local path forwarding, as shipped);
- splice: the alternative, our own unix server doing `open_connection` and two copy loops
  over the same tunnel;
- proxy direct / proxy tunnel: the access proxy in front, its route direct or `via_tunnel`.
Load: 2,000 sequential small requests (after 200 to warm up), one 200 MB download, 1,000
WebSocket echo round trips. For streams over NATS, from a peer in its own process: small
request/reply round trips, and 64 KiB chunks sent stop-and-wait, 16 in flight, and as a flood.

Also: an agent's connect-to-authorised time under the NATS auth callout (against a static nkey
user), and the tunnel's own connect time (`tunnel_connect_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _harness import report, summary_ms

BIG = 200 * 1000 * 1000
CHUNK = 64 * 1024
SEQUENTIAL = 2000
WARM_UP = 200
WS_ROUNDS = 1000
NATS_ROUNDS = 2000
NATS_BYTES = 200 * 1000 * 1000
WINDOW = 16


# --- the processes other than this one ---------------------------------------------------------


def upstream_main(port: int) -> None:
    from aiohttp import WSMsgType, web

    block = b"x" * CHUNK

    async def small(_: web.Request) -> web.Response:
        return web.Response(body=b"ok" * 32, content_type="text/plain")

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(BIG)})
        await resp.prepare(request)
        left = BIG
        while left:
            await resp.write(block[: min(left, CHUNK)])
            left -= min(left, CHUNK)
        return resp

    async def echo(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            if msg.type == WSMsgType.TEXT:
                await sock.send_str(msg.data)
        return sock

    app = web.Application()
    app.router.add_get("/big", big)
    app.router.add_get("/ws", echo)
    app.router.add_get("/{tail:.*}", small)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def agent_main(hub_port: int, host_key: str, hub_key: str, port: int, machine: str) -> None:
    from einsora.agent.tunnel import AgentTunnel

    t0 = time.perf_counter()
    tunnel = AgentTunnel(
        ("127.0.0.1", hub_port), Path(host_key), hub_key, lambda: {port}, machine_id=machine
    )
    await tunnel.start()
    await tunnel.connected.wait()
    print(json.dumps({"connected_ms": (time.perf_counter() - t0) * 1000}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until we are told
    await tunnel.stop()


async def load_main(url: str, unix: str, host: str, cookie: str) -> None:
    import aiohttp

    headers = {"Host": host, "Cookie": cookie} if host else {}
    connector = aiohttp.UnixConnector(unix) if unix else aiohttp.TCPConnector()
    async with aiohttp.ClientSession(connector=connector) as http:
        latencies = []
        for i in range(WARM_UP + SEQUENTIAL):
            t0 = time.perf_counter()
            async with http.get(url + "/", headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            if i >= WARM_UP:
                latencies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = 0
        async with http.get(url + "/big", headers=headers) as resp:
            async for chunk in resp.content.iter_any():
                got += len(chunk)
        download_s = time.perf_counter() - t0
        assert got == BIG, got
        ws_headers = {**headers, "Origin": f"http://{host}"} if host else {}
        ws_times = []
        async with http.ws_connect(url.replace("http", "ws", 1) + "/ws", headers=ws_headers) as ws:
            for i in range(WS_ROUNDS):
                t0 = time.perf_counter()
                await ws.send_str(str(i))
                await ws.receive_str()
                ws_times.append(time.perf_counter() - t0)
    figures = {"latencies_s": latencies, "download_mb_s": BIG / download_s / 1e6, "ws_s": ws_times}
    print(json.dumps(figures))


async def nats_peer_main(url: str) -> None:
    import nats

    nc = await nats.connect(url)
    received = 0

    async def echo(msg: Any) -> None:
        await msg.respond(msg.data)

    async def ack(msg: Any) -> None:
        await msg.respond(b"")

    async def flood(msg: Any) -> None:
        nonlocal received
        received += len(msg.data)
        if msg.reply:  # the last one: say how much arrived
            await msg.respond(str(received).encode())
            received = 0

    await nc.subscribe("bench.tunnel.echo", cb=echo)
    await nc.subscribe("bench.tunnel.chunk", cb=ack)
    await nc.subscribe("bench.tunnel.flood", cb=flood, pending_bytes_limit=1 << 30)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await nc.close()


# --- this process ------------------------------------------------------------------------------


def role(*args: str, stdin: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
    )


async def line_of(proc: subprocess.Popen[bytes]) -> bytes:
    assert proc.stdout is not None
    return await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)


async def load(url: str, unix: str = "", host: str = "", cookie: str = "") -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "load", url, unix, host, cookie, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the load failed for {url} {unix}")
    result: dict[str, Any] = json.loads(out)
    return result


async def wait_port(port: int) -> None:
    for _ in range(400):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


async def splice_server(hub: Any, machine: str, port: int, path: str) -> asyncio.AbstractServer:
    """The alternative forward: accept, open a channel, copy both ways."""

    async def pump(reader: Any, writer: Any) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        finally:
            if writer.can_write_eof():
                writer.write_eof()  # half-close: the other direction may still be talking
            else:
                writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        remote_reader, remote_writer = await hub.open_connection(machine, port)
        with contextlib.suppress(Exception):
            await asyncio.gather(pump(reader, remote_writer), pump(remote_reader, writer))
        writer.close()
        remote_writer.close()

    return await asyncio.start_unix_server(handle, path)


async def nats_figures(url: str) -> dict[str, float]:
    import nats

    peer = role("nats-peer", url, stdin=True)
    try:
        assert (await line_of(peer)).strip() == b"ready"
        nc = await nats.connect(url)
        small = b"x" * 64
        for _ in range(WARM_UP):
            await nc.request("bench.tunnel.echo", small, timeout=5)
        rtts = []
        for _ in range(NATS_ROUNDS):
            t0 = time.perf_counter()
            await nc.request("bench.tunnel.echo", small, timeout=5)
            rtts.append(time.perf_counter() - t0)
        chunk = b"c" * CHUNK
        count = NATS_BYTES // CHUNK

        t0 = time.perf_counter()
        for _ in range(count):
            await nc.request("bench.tunnel.chunk", chunk, timeout=5)
        stop_and_wait = count * CHUNK / (time.perf_counter() - t0) / 1e6

        t0 = time.perf_counter()
        window = asyncio.Semaphore(WINDOW)

        async def one() -> None:
            async with window:
                await nc.request("bench.tunnel.chunk", chunk, timeout=10)

        await asyncio.gather(*(one() for _ in range(count)))
        windowed = count * CHUNK / (time.perf_counter() - t0) / 1e6

        t0 = time.perf_counter()
        for _ in range(count):
            await nc.publish("bench.tunnel.flood", chunk)
        arrived = int((await nc.request("bench.tunnel.flood", b"", timeout=60)).data)
        flood = arrived / (time.perf_counter() - t0) / 1e6
        await nc.close()
    finally:
        assert peer.stdin is not None
        peer.stdin.close()
        peer.wait(10)
    rtt = summary_ms(rtts)
    return {
        "nats_rtt_p50_ms": rtt["p50"],
        "nats_rtt_p99_ms": rtt["p99"],
        "nats_chunks_stop_and_wait_mb_per_s": round(stop_and_wait, 1),
        f"nats_chunks_window{WINDOW}_mb_per_s": round(windowed, 1),
        "nats_flood_mb_per_s": round(flood, 1),
        "nats_flood_delivered_fraction": round(arrived / (count * CHUNK), 4),
    }


def path_figures(name: str, result: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    lat, ref = summary_ms(result["latencies_s"]), summary_ms(base["latencies_s"])
    ws = summary_ms(result["ws_s"])
    return {
        f"{name}_p50_ms": lat["p50"],
        f"{name}_p99_ms": lat["p99"],
        f"{name}_added_p50_ms": round(lat["p50"] - ref["p50"], 3),
        f"{name}_added_p99_ms": round(lat["p99"] - ref["p99"], 3),
        f"{name}_download_mb_per_s": round(result["download_mb_s"], 1),
        f"{name}_ws_p50_ms": ws["p50"],
        f"{name}_ws_p99_ms": ws["p99"],
    }


async def callout_figures(n: int = 200) -> dict[str, float]:
    """Connect-to-authorised time of an agent under the auth callout (the api's responder on a
    real server in Solo's accounts layout) against a static nkey user, `n` sequential connects
    each (the first PONG ends a connect)."""
    import nats

    from einsora.common.bus import accounts, connect, identities
    from einsora.common.bus.callout import AuthCallout, Grant
    from einsora.common.embedded_nats import EmbeddedNats

    machine, credential = "m-bench", "agk_" + "b" * 43
    with tempfile.TemporaryDirectory(prefix="ec-", dir="/tmp") as tmp:
        creds = Path(tmp) / "bus"
        static = identities.ensure_identity(creds, identities.SCHEDULER)
        callout = identities.ensure_identity(creds, identities.CALLOUT)
        issuer = identities.ensure_issuer(creds)
        conf = accounts.server_auth_conf(
            {identities.SCHEDULER: (static, identities.service_permissions(identities.SCHEDULER))},
            callout=callout,
            system=identities.ensure_identity(creds, identities.SYSTEM),
            issuer_public_key=issuer.public_key,
        )
        with EmbeddedNats(
            Path(tmp) / "nats", port=0, authorization=conf, app_account=accounts.APP_ACCOUNT
        ) as server:

            async def authorize(token: str) -> Grant | None:
                if token != credential:
                    return None
                return Grant(machine, identities.agent_permissions(machine), 600.0)

            responder = AuthCallout(issuer, authorize)
            callout_nc = await connect(server.url, name="bench-callout", credentials=callout)
            await responder.start(callout_nc)

            async def timed(**options: Any) -> list[float]:
                times = []
                for _ in range(n):
                    started = time.perf_counter()
                    nc = await nats.connect(server.url, allow_reconnect=False, **options)
                    times.append((time.perf_counter() - started) * 1000)
                    await nc.close()
                return times

            agent = await timed(token=credential, inbox_prefix=f"_INBOX_{machine}")
            nkey = await timed(nkeys_seed_str=static.seed)
            await responder.stop()
            await callout_nc.close()
    figures: dict[str, float] = {}
    for name, times in (("callout", agent), ("static_nkey", nkey)):
        ordered = sorted(times)
        figures[f"{name}_connect_p50_ms"] = round(statistics.median(ordered), 3)
        figures[f"{name}_connect_p95_ms"] = round(ordered[int(len(ordered) * 0.95) - 1], 3)
    return figures


async def main() -> None:
    from einsora.agent.tunnel import make_host_key
    from einsora.common.bus import connect, names, provision
    from einsora.common.embedded_nats import EmbeddedNats
    from einsora.common.ids import new_id
    from einsora.common.schemas import Enrolment, Route, WorkloadKind
    from einsora.common.settings import Settings
    from einsora.common.tunnel_clients import socket_path
    from einsora.proxy.service import ProxyService

    up_port = free_port()
    upstream = role("upstream", str(up_port))
    agent: subprocess.Popen[bytes] | None = None
    # A short dir: a unix socket's path may not pass 107 bytes.
    with (
        tempfile.TemporaryDirectory(prefix="eb-", dir="/tmp") as tmp,
        EmbeddedNats(Path(tmp) / "nats", port=0) as server,
    ):
        data = Path(tmp)
        try:
            await wait_port(up_port)
            nc = await connect(server.url, name="bench-tunnel")
            js = nc.jetstream()
            await provision(js)
            machine = new_id("machine")
            host_key = data / "agent" / "tunnel_host_key"
            enrolment = Enrolment(
                machine_id=machine,
                owner_tenant_id="t",
                region="local",
                tunnel=True,
                tunnel_key=make_host_key(host_key),
            )
            kv = await js.key_value(names.ENROLMENTS.name)
            await kv.put(names.enrolment_key(machine), enrolment.to_bytes())
            proxy = ProxyService(
                Settings(nats_url=server.url, proxy_port=0, tunnel_port=0, data_dir=data)
            )
            await proxy.start()
            assert proxy.hub is not None
            routes = await js.key_value(names.ROUTES.name)
            sites = {}
            for via_tunnel in (False, True):
                workload = new_id("workload")
                route = Route(
                    workload_id=workload,
                    tenant_id="t",
                    kind=WorkloadKind.endpoint,
                    machine_id=machine,
                    host="127.0.0.1",
                    port=up_port,
                    via_tunnel=via_tunnel,
                )
                await routes.put(names.route_key(workload), route.to_bytes())
                while proxy.route(workload) is None:
                    await asyncio.sleep(0.01)
                sites[via_tunnel] = (
                    f"{workload}.localhost:{proxy.port}",
                    f"einsora-site={proxy.sessions.create(workload, 't', 'u')}",
                )
            while proxy.enrolments.get(machine) is None:
                await asyncio.sleep(0.01)

            agent = role(
                "agent", str(proxy.hub.port), str(host_key), proxy.hub.public_key, str(up_port),
                machine, stdin=True,
            )  # fmt: skip
            connect_ms = json.loads(await line_of(agent))["connected_ms"]
            sock = socket_path(data / "tunnel" / "sockets", machine, up_port)
            while not sock.exists():
                await asyncio.sleep(0.01)
            splice_path = str(data / "splice.sock")
            splice = await splice_server(proxy.hub, machine, up_port, splice_path)

            origin = f"http://127.0.0.1:{up_port}"
            proxy_url = f"http://127.0.0.1:{proxy.port}"
            direct = await load(origin)
            tunnel = await load(origin, unix=str(sock))
            spliced = await load(origin, unix=splice_path)
            proxy_direct = await load(proxy_url, "", *sites[False])
            proxy_tunnel = await load(proxy_url, "", *sites[True])
            splice.close()
            cipher = next(iter(proxy.hub._conns.values())).get_extra_info("send_cipher")
            await proxy.stop()
            await nc.close()
            bus = await nats_figures(server.url)
        finally:
            if agent is not None and agent.stdin is not None:
                agent.stdin.close()
                agent.wait(10)
            upstream.terminate()

    figures: dict[str, Any] = {"tunnel_connect_ms": round(connect_ms, 2), "cipher": cipher}
    figures.update(path_figures("direct", direct, direct))
    figures.update(path_figures("tunnel", tunnel, direct))
    figures.update(path_figures("splice", spliced, direct))
    figures.update(path_figures("proxy_direct", proxy_direct, direct))
    figures.update(path_figures("proxy_tunnel", proxy_tunnel, proxy_direct))
    figures.update(bus)
    figures.update(await callout_figures())
    for gone in ("direct_added_p50_ms", "direct_added_p99_ms"):
        figures.pop(gone)

    def row(name: str, label: str, against: str) -> tuple[str, str]:
        f = figures
        added = (
            ""
            if name == "direct"
            else f" (+{f[f'{name}_added_p50_ms']} / +{f[f'{name}_added_p99_ms']} on {against})"
        )
        return (
            label,
            f"p50 {f[f'{name}_p50_ms']} ms, p99 {f[f'{name}_p99_ms']} ms{added}; "
            f"200 MB at {f[f'{name}_download_mb_per_s']} MB/s; "
            f"WebSocket echo p50 {f[f'{name}_ws_p50_ms']} ms, p99 {f[f'{name}_ws_p99_ms']} ms",
        )

    rows = [
        row("direct", "straight to the upstream", ""),
        row("tunnel", "through the tunnel (asyncssh's forward)", "direct"),
        row("splice", "through the tunnel (our splice)", "direct"),
        row("proxy_direct", "access proxy, route direct", "direct"),
        row("proxy_tunnel", "access proxy, route through the tunnel", "proxy direct"),
        ("tunnel connect (agent start to up)", f"{figures['tunnel_connect_ms']} ms, {cipher}"),
        (
            "streams over NATS (the other candidate)",
            f"request/reply p50 {figures['nats_rtt_p50_ms']} ms, p99 {figures['nats_rtt_p99_ms']}"
            f" ms; 64 KiB chunks: {figures['nats_chunks_stop_and_wait_mb_per_s']} MB/s "
            f"stop-and-wait, {figures[f'nats_chunks_window{WINDOW}_mb_per_s']} MB/s with "
            f"{WINDOW} in flight, {figures['nats_flood_mb_per_s']} MB/s flooded "
            f"({figures['nats_flood_delivered_fraction']:.0%} delivered)",
        ),
        (
            "agent connect under auth callout",
            f"p50 {figures['callout_connect_p50_ms']} ms, p95 {figures['callout_connect_p95_ms']}"
            f" ms (a static nkey user: p50 {figures['static_nkey_connect_p50_ms']} ms, p95 "
            f"{figures['static_nkey_connect_p95_ms']} ms)",
        ),
        ("targets", "tunnel added p50 <= 1 ms; 200 MB download >= 100 MB/s on loopback"),
    ]
    report("tunnel", rows, figures)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", nargs="+", help="run one of the other processes (internal)")
    args = parser.parse_args()
    from einsora.common import runloop

    if not args.role:
        runloop.run(main())
    elif args.role[0] == "upstream":
        upstream_main(int(args.role[1]))
    elif args.role[0] == "agent":
        a = args.role[1:]
        runloop.run(agent_main(int(a[0]), a[1], a[2], int(a[3]), a[4]))
    elif args.role[0] == "load":
        url, unix, host, cookie = [*args.role[1:], "", "", ""][:4]
        runloop.run(load_main(url, unix, host, cookie))
    elif args.role[0] == "nats-peer":
        runloop.run(nats_peer_main(args.role[1]))
