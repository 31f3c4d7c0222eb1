"""The control API under load: POST /v1/workloads throughput and GET /v1/workloads latency.

Runs `einsora api` as its own process (SQLite store, an embedded nats-server with
`sync_interval: always`), as a deployment would, and drives it from this process over
kept-alive HTTP connections:
- POST /v1/workloads: 10,000 launches from concurrent clients, requests/s (each writes the
  workload, its timeline entry and its outbox row in one transaction; the relay publishes the
  intents meanwhile, and the time until the outbox is empty is reported too);
- GET /v1/workloads?limit=50 with those 10,000 workloads in the store: p50/p99, one client.
Targets on a 2-core machine (issue 11): POST >= 1,500/s, GET p99 <= 5 ms. Figures, never
pass/fail. `--postgres [URL]` runs the api on a fresh Postgres database instead of SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import aiohttp
import asyncpg
from _harness import DEFAULT_POSTGRES, fresh_postgres, report, summary_ms
from sqlalchemy.engine import make_url

from einsora.common.embedded_nats import EmbeddedNats

WORKLOADS = 10_000
CONCURRENCY = 16
GETS = 2_000
_LISTENING = re.compile(r"listening on (http://\S+)")
API_LIMITS_OFF = {
    "EINSORA_API_REQUESTS_PER_MINUTE": "0",
    "EINSORA_API_LAUNCHES_PER_MINUTE": "0",
    "EINSORA_TENANT_MAX_WORKLOADS": "0",
}
"""The api's rate limits and workload cap, off: 10,000 launches from one token is what they
are there to refuse."""


def start_api(
    nats_url: str, data_dir: Path, database_url: str | None
) -> tuple[subprocess.Popen[str], str]:
    database = ["--database-url", database_url] if database_url else []
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "einsora.api.command",
            "--nats",
            nats_url,
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            *database,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "EINSORA_LOG_LEVEL": "WARNING", **API_LIMITS_OFF},
    )
    assert process.stderr is not None
    for line in process.stderr:
        match = _LISTENING.search(line)
        if match:
            return process, match[1]
    raise SystemExit(f"einsora api did not start (exit {process.wait()})")


async def post_workloads(session: aiohttp.ClientSession, url: str) -> float:
    body = {"kind": "notebook", "class": "cpu-1c-2g", "spec": {"image": "jupyter/base"}}
    remaining = iter(range(WORKLOADS))

    async def worker() -> None:
        for _ in remaining:
            async with session.post(url + "/v1/workloads", json=body) as resp:
                await resp.read()
                if resp.status != 201:
                    raise SystemExit(f"POST answered {resp.status}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return WORKLOADS / (time.perf_counter() - t0)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_UNSENT = "SELECT count(*) FROM outbox WHERE sent_at IS NULL"


async def unsent(db: Path | str) -> int:
    if isinstance(db, Path):
        with sqlite3.connect(db) as conn:
            return int(conn.execute(_UNSENT).fetchone()[0])
    conn = await asyncpg.connect(make_url(db).set(drivername="postgresql").render_as_string(False))
    try:
        return int(await conn.fetchval(_UNSENT))
    finally:
        await conn.close()


async def wait_for_outbox(db: Path | str) -> float:
    t0 = time.perf_counter()
    while await unsent(db):
        await asyncio.sleep(0.05)
    return time.perf_counter() - t0


async def get_pages(session: aiohttp.ClientSession, url: str) -> list[float]:
    samples = []
    for _ in range(GETS):
        t0 = time.perf_counter()
        async with session.get(url + "/v1/workloads", params={"limit": "50"}) as resp:
            body = await resp.json()
        samples.append(time.perf_counter() - t0)
        assert len(body["items"]) == 50
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres",
        nargs="?",
        const=DEFAULT_POSTGRES,
        metavar="URL",
        help=f"a Postgres server to make a fresh database on (default {DEFAULT_POSTGRES})",
    )
    args = parser.parse_args()
    if args.postgres:
        async with fresh_postgres(args.postgres) as database_url:
            await measure(database_url)
    else:
        await measure(None)


async def measure(database_url: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats", port=0) as nats:
        data_dir = Path(tmp) / "data"
        process, url = start_api(nats.url, data_dir, database_url)
        try:
            token = (data_dir / "owner.token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            connector = aiohttp.TCPConnector(limit=CONCURRENCY)
            async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
                cpu0 = cpu_seconds(process.pid)
                post_rate = await post_workloads(session, url)
                drain_s = await wait_for_outbox(database_url or data_dir / "einsora.db")
                post_cpu_ms = (cpu_seconds(process.pid) - cpu0) * 1000 / WORKLOADS
                cpu0 = cpu_seconds(process.pid)
                gets = summary_ms(await get_pages(session, url))
                get_cpu_ms = (cpu_seconds(process.pid) - cpu0) * 1000 / GETS
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    figures = {
        "post_workloads_per_s": round(post_rate),
        "post_concurrency": CONCURRENCY,
        "outbox_drained_after_posts_s": round(drain_s, 3),
        "api_cpu_per_post_ms": round(post_cpu_ms, 3),
        "api_cpu_per_get_ms": round(get_cpu_ms, 3),
        "get_workloads_limit50_p50_ms": gets["p50"],
        "get_workloads_limit50_p99_ms": gets["p99"],
        "workloads_in_store": WORKLOADS,
        "store": "postgres" if database_url else "sqlite",
    }
    report(
        "api" if database_url is None else "api-postgres",
        [
            ("store", "Postgres (asyncpg)" if database_url else "SQLite (the Solo default)"),
            (
                f"POST /v1/workloads ({WORKLOADS:,}, {CONCURRENCY} clients)",
                f"{post_rate:,.0f} requests/s (target >= 1,500)",
            ),
            ("outbox empty after the last POST", f"{drain_s:.3f} s"),
            ("api process CPU per POST (relay included)", f"{post_cpu_ms:.3f} ms"),
            (
                f"GET /v1/workloads?limit=50 ({GETS:,}, one client)",
                f"p50 {gets['p50']} ms, p99 {gets['p99']} ms (target p99 <= 5)",
            ),
            ("api process CPU per GET", f"{get_cpu_ms:.3f} ms"),
        ],
        figures,
    )


if __name__ == "__main__":
    asyncio.run(main())
