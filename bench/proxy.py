"""The access proxy's cost, beside JupyterHub's configurable-http-proxy (CHP) to the same upstream.

Runs the upstream and the load generator as processes of their own, our proxy in this process
(with a real nats-server for its routes), and CHP (npm package, installed under .data/bench/chp
on first use) the same way. Figures: added latency p50/p99 over 2,000 sequential small requests
(proxied minus direct), throughput with 50 concurrent clients, and WebSocket echo round trips.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _harness import RESULTS_DIR, report, summary_ms

from einsora.common import runloop
from einsora.common.bus import connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import Route, WorkloadKind
from einsora.common.settings import Settings
from einsora.proxy.service import ProxyService

TOOLS = Path(__file__).parent / "tools"
CHP_DIR = RESULTS_DIR / "chp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_port(port: int, within_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def load(url: str, host: str = "", cookie: str = "") -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TOOLS / "load.py"), url, host, cookie, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed for {url}")
    result: dict[str, Any] = json.loads(out)
    return result


def chp_binary() -> Path | None:
    binary = CHP_DIR / "node_modules" / ".bin" / "configurable-http-proxy"
    if binary.exists():
        return binary
    if shutil.which("npm") is None:
        return None
    CHP_DIR.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["npm", "install", "--silent", "--prefix", str(CHP_DIR), "configurable-http-proxy@5"],
        check=False,
        capture_output=True,
    )
    return binary if done.returncode == 0 and binary.exists() else None


def figures_of(name: str, result: dict[str, Any], direct: dict[str, Any]) -> dict[str, float]:
    lat = summary_ms(result["latencies_s"])
    base = summary_ms(direct["latencies_s"])
    ws = summary_ms(result["ws_s"])
    return {
        f"{name}_added_p50_ms": round(lat["p50"] - base["p50"], 3),
        f"{name}_added_p99_ms": round(lat["p99"] - base["p99"], 3),
        f"{name}_throughput_per_s": round(result["throughput_per_s"]),
        f"{name}_ws_rtt_p50_ms": ws["p50"],
        f"{name}_ws_rtt_p99_ms": ws["p99"],
    }


async def main() -> None:
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(TOOLS / "upstream.py"), str(upstream_port)])
    chp: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats", port=0) as nats:
        try:
            await wait_port(upstream_port)
            direct = await load(f"http://127.0.0.1:{upstream_port}")

            settings = Settings(nats_url=nats.url, proxy_port=0, data_dir=Path(tmp))
            proxy = ProxyService(settings)
            await proxy.start()
            nc = await connect(nats.url, name="bench-proxy")
            js = nc.jetstream()
            await provision(js)
            workload_id = new_id("workload")
            kv = await js.key_value(names.ROUTES.name)
            route = Route(
                workload_id=workload_id,
                tenant_id="t",
                kind=WorkloadKind.endpoint,
                machine_id="m",
                host="127.0.0.1",
                port=upstream_port,
            )
            await kv.put(names.route_key(workload_id), route.to_bytes())
            while proxy.route(workload_id) is None:
                await asyncio.sleep(0.01)
            cookie = proxy.sessions.create(workload_id, "t", "u")
            ours = await load(
                f"http://127.0.0.1:{proxy.port}",
                f"{workload_id}.localhost:{proxy.port}",
                f"einsora-site={cookie}",
            )
            await proxy.stop()
            await nc.close()

            theirs = None
            binary = chp_binary()
            if binary is not None:
                chp_port = free_port()
                chp = subprocess.Popen(
                    [
                        str(binary),
                        "--ip",
                        "127.0.0.1",
                        "--port",
                        str(chp_port),
                        "--api-ip",
                        "127.0.0.1",
                        "--api-port",
                        str(free_port()),
                        "--default-target",
                        f"http://127.0.0.1:{upstream_port}",
                        "--log-level",
                        "error",
                    ],
                    env={**os.environ, "CONFIGPROXY_AUTH_TOKEN": new_id("token")},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                await wait_port(chp_port)
                theirs = await load(f"http://127.0.0.1:{chp_port}")
        finally:
            upstream.terminate()
            if chp is not None:
                chp.terminate()

    figures = figures_of("einsora", ours, direct)
    direct_ms = summary_ms(direct["latencies_s"])
    figures.update(
        {
            "direct_p50_ms": direct_ms["p50"],
            "direct_p99_ms": direct_ms["p99"],
            "direct_throughput_per_s": round(direct["throughput_per_s"]),
        }
    )
    if theirs is not None:
        figures.update(figures_of("chp", theirs, direct))
    rows = [
        (
            "straight to the upstream",
            f"p50 {direct_ms['p50']} ms, p99 {direct_ms['p99']} ms, "
            f"{direct['throughput_per_s']:,.0f} req/s",
        )
    ]
    for name, label in (("einsora", "through Einsora's proxy"), ("chp", "through CHP")):
        if f"{name}_added_p50_ms" in figures:
            rows.append(
                (
                    label,
                    f"+{figures[f'{name}_added_p50_ms']} ms p50, "
                    f"+{figures[f'{name}_added_p99_ms']} ms p99, "
                    f"{figures[f'{name}_throughput_per_s']:,} req/s (50 clients), "
                    f"WebSocket echo p50 {figures[f'{name}_ws_rtt_p50_ms']} ms",
                )
            )
    if theirs is None:
        rows.append(("through CHP", "not measured: npm is not available"))
    report("proxy", rows, figures)


if __name__ == "__main__":
    runloop.run(main())
