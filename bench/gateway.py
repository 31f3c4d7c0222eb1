"""The inference gateway's cost, beside LiteLLM's proxy, in front of the same upstream.

The upstream is a sim endpoint (the product's simulated model, answering at once) in a process
of its own; the load generator is another process; our gateway runs in this one, with a real
nats-server for its keys and routes and a key without limits (the common case: limits cost a
compare-and-set on the bus, measured apart as `limited_*`). LiteLLM's proxy (`litellm[proxy]`,
installed on first use into its own venv under ~/.cache/einsora-bench/litellm, one worker,
`LITELLM_LOCAL_MODEL_COST_MAP=True`, its master key as the client's key) is measured the same
way. Figures: added latency p50/p99 over
2,000 sequential chat completions (through, minus direct), streaming time to first byte, and
throughput with 100 concurrent clients.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _harness import report, summary_ms

from einsora.common import runloop
from einsora.common.bus import connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import GatewayKey, Route, WorkloadKind
from einsora.common.settings import Settings
from einsora.gateway.service import GatewayService

TOOLS = Path(__file__).parent / "tools"
LITELLM_VENV = Path.home() / ".cache" / "einsora-bench" / "litellm"
MODEL = "sim-chat"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_http(url: str, within_s: float = 60.0) -> None:
    import aiohttp

    deadline = asyncio.get_running_loop().time() + within_s
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url} did not answer within {within_s} s")
            await asyncio.sleep(0.1)


async def load(base: str, key: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TOOLS / "openai_load.py"), base, key, MODEL, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed for {base}")
    result: dict[str, Any] = json.loads(out)
    return result


def litellm_binary() -> Path | None:
    binary = LITELLM_VENV / "bin" / "litellm"
    if binary.exists():
        return binary
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    done = subprocess.run(
        [str(LITELLM_VENV / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"],
        check=False,
    )
    return binary if done.returncode == 0 and binary.exists() else None


async def run_litellm(upstream_port: int, tmp: Path) -> dict[str, Any] | None:
    binary = litellm_binary()
    if binary is None:
        return None
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n"
        "      api_key: none\n"
    )
    port = free_port()
    # It refuses to start without a master key; a key checked on each request, as ours is.
    master_key = f"sk-{secrets.token_hex(32)}"
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_MASTER_KEY": master_key,
    }
    proc = subprocess.Popen(
        [
            *(str(binary), "--config", str(config), "--host", "127.0.0.1"),
            *("--port", str(port), "--num_workers", "1"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_http(f"http://127.0.0.1:{port}/health/liveliness", within_s=120)
        return await load(f"http://127.0.0.1:{port}/v1", master_key)
    finally:
        proc.terminate()
        proc.wait(10)


def figures_of(name: str, result: dict[str, Any], direct: dict[str, Any]) -> dict[str, float]:
    lat = summary_ms(result["latencies_s"])
    base = summary_ms(direct["latencies_s"])
    ttfb = summary_ms(result["first_byte_s"])
    return {
        f"{name}_added_p50_ms": round(lat["p50"] - base["p50"], 3),
        f"{name}_added_p99_ms": round(lat["p99"] - base["p99"], 3),
        f"{name}_stream_ttfb_p50_ms": ttfb["p50"],
        f"{name}_stream_ttfb_p99_ms": ttfb["p99"],
        f"{name}_throughput_per_s": round(result["throughput_per_s"]),
    }


async def put_key(kv: Any, tenant: str, **limits: int) -> str:
    key = f"esk_{secrets.token_urlsafe(32)}"
    key_id = new_id("gateway_key")
    value = GatewayKey(
        key_id=key_id,
        tenant_id=tenant,
        user_id="u-bench",
        name="bench",
        key_hash=hashlib.sha256(key.encode()).hexdigest(),
        **limits,
    )
    await kv.put(names.gateway_key_key(key_id), value.to_bytes())
    return key


async def main(with_litellm: bool) -> None:
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(TOOLS / "sim_upstream.py"), str(upstream_port), MODEL]
    )
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats", port=0) as nats:
        try:
            await wait_http(f"http://127.0.0.1:{upstream_port}/health")
            direct = await load(f"http://127.0.0.1:{upstream_port}/v1", "")

            nc = await connect(nats.url, name="bench-gateway")
            js = nc.jetstream()
            await provision(js)
            tenant = "t-bench"
            keys = await js.key_value(names.GATEWAY_KEYS.name)
            plain_key = await put_key(keys, tenant)
            limited_key = await put_key(keys, tenant, rpm=10**9, tpm=10**12)
            routes = await js.key_value(names.ROUTES.name)
            workload_id = new_id("workload")
            route = Route(
                workload_id=workload_id,
                tenant_id=tenant,
                kind=WorkloadKind.endpoint,
                machine_id="m-bench",
                host="127.0.0.1",
                port=upstream_port,
                name=MODEL,
                runtime="sim",
            )
            await routes.put(names.route_key(workload_id), route.to_bytes())
            settings = Settings(nats_url=nats.url, gateway_port=0, data_dir=Path(tmp))
            gateway = GatewayService(settings)
            await gateway.start()
            base = f"http://127.0.0.1:{gateway.port}/v1"
            await wait_http(f"{base}/models")
            ours = await load(base, plain_key)
            limited = await load(base, limited_key)
            await gateway.stop()
            await nc.close()
            theirs = await run_litellm(upstream_port, Path(tmp)) if with_litellm else None
        finally:
            upstream.terminate()

    figures = figures_of("einsora", ours, direct)
    figures.update(figures_of("limited", limited, direct))
    d = summary_ms(direct["latencies_s"])
    d_ttfb = summary_ms(direct["first_byte_s"])
    figures.update(
        {
            "direct_p50_ms": d["p50"],
            "direct_p99_ms": d["p99"],
            "direct_stream_ttfb_p50_ms": d_ttfb["p50"],
            "direct_throughput_per_s": round(direct["throughput_per_s"]),
        }
    )
    if theirs is not None:
        figures.update(figures_of("litellm", theirs, direct))
    rows = [
        (
            "straight to the sim endpoint",
            f"p50 {d['p50']} ms, p99 {d['p99']} ms, stream first byte p50 {d_ttfb['p50']} ms, "
            f"{direct['throughput_per_s']:,.0f} req/s (100 clients)",
        )
    ]
    labels = (
        ("einsora", "through Einsora's gateway"),
        ("limited", "  … with RPM and TPM limits"),
        ("litellm", "through LiteLLM's proxy"),
    )
    for name, label in labels:
        if f"{name}_added_p50_ms" in figures:
            rows.append(
                (
                    label,
                    f"+{figures[f'{name}_added_p50_ms']} ms p50, "
                    f"+{figures[f'{name}_added_p99_ms']} ms p99, stream first byte p50 "
                    f"{figures[f'{name}_stream_ttfb_p50_ms']} ms, "
                    f"{figures[f'{name}_throughput_per_s']:,} req/s",
                )
            )
    if theirs is None:
        rows.append(("through LiteLLM's proxy", "not measured (--no-litellm, or install failed)"))
    report("gateway", rows, figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-litellm", action="store_true", help="measure only our gateway")
    args = parser.parse_args()
    runloop.run(main(not args.no_litellm))
