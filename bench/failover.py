"""Failover: how long a region goes without a scheduler after its leader's SIGKILL.

Runs a real 3-node NATS cluster (JetStream R3, `sync_interval: always`), one fresh Postgres
database and two `einsora scheduler` processes for region `local`: a leader and a standby
(ADR-0021). Then, `--kills` times: SIGKILL the leader, and measure
- until the standby has taken the lease (its term written to `_leader.local.term`), and
- until it serves (its `/metrics` says `einsora_scheduler_leader 1`: book loaded, bucket read,
  intents consumed);
then start the killed one again as the new standby. Both from the SIGKILL, median and max.
The lease is `EINSORA_SCHEDULER_LEASE_S` (default 3 s): a standby takes over after that long
without a heartbeat, so the figures are the lease plus the takeover's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import aiohttp
from _harness import DEFAULT_POSTGRES, fresh_postgres, report
from nats.js.errors import KeyNotFoundError

from einsora.common.bus import bind_bucket, names
from einsora.common.nats_cluster import NatsCluster, free_ports
from einsora.common.schemas import LeaderLease
from einsora.common.settings import Settings


def _spawn(url: str, database: str, data_dir: Path, metrics_port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "EINSORA_LOG_LEVEL": "WARNING",
        "EINSORA_NATS_REPLICAS": "3",
        "EINSORA_DATA_DIR": str(data_dir),
        "EINSORA_SCHEDULER_METRICS_PORT": str(metrics_port),
    }
    command = [
        str(Path(sys.executable).parent / "einsora"),
        "scheduler",
        "--nats",
        url,
        "--database-url",
        database,
    ]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env)


async def _serving(http: aiohttp.ClientSession, port: int) -> bool:
    try:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return False
    return 'einsora_scheduler_leader{region="local"} 1.0' in text


async def run(kills: int, postgres: str) -> None:
    lease_s = Settings().scheduler_lease_s
    with tempfile.TemporaryDirectory() as tmp:
        cluster = NatsCluster(Path(tmp) / "nats")
        cluster.start()
        nc = await cluster.ready()
        kv = bind_bucket(nc.jetstream(timeout=5), names.MACHINES)

        async def lease() -> LeaderLease | None:
            try:
                entry = await kv.get(names.leader_term_key("local"))
            except KeyNotFoundError:
                return None
            return LeaderLease.from_bytes(entry.value) if entry.value else None

        taken: list[float] = []
        serving: list[float] = []
        async with fresh_postgres(postgres) as database, aiohttp.ClientSession() as http:
            ports = free_ports(2)
            dirs = [Path(tmp) / "a", Path(tmp) / "b"]
            procs = [_spawn(cluster.url, database, dirs[i], ports[i]) for i in range(2)]
            try:
                leader = await _wait_for(lambda: _any_serving(http, ports), 60)
                for _ in range(kills):
                    i = leader
                    before = await lease()
                    assert before is not None
                    # The other must be standing by (its holder id written) before the kill.
                    standby_dir, standby_port = dirs[1 - i], ports[1 - i]
                    await _wait_for(functools.partial(_ready, standby_dir), 60)
                    await asyncio.sleep(lease_s)  # a settled standby, as in a real cell
                    os.kill(procs[i].pid, signal.SIGKILL)
                    procs[i].wait()
                    killed = time.monotonic()

                    async def moved(term: int = before.term) -> bool:
                        now = await lease()
                        return now is not None and now.term > term

                    await _wait_for(moved, 30)
                    taken.append(time.monotonic() - killed)
                    await _wait_for(functools.partial(_serving_as, http, standby_port), 30)
                    serving.append(time.monotonic() - killed)
                    procs[i] = _spawn(cluster.url, database, dirs[i], ports[i])
                    leader = 1 - i
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                        p.wait(30)
        await nc.close()
        cluster.stop()

    def ms(values: list[float], f: str) -> float:
        value = statistics.median(values) if f == "median" else max(values)
        return round(value * 1000, 1)

    figures = {
        "kills": kills,
        "lease_s": lease_s,
        "takeover_median_ms": ms(taken, "median"),
        "takeover_max_ms": ms(taken, "max"),
        "serving_median_ms": ms(serving, "median"),
        "serving_max_ms": ms(serving, "max"),
        "nats": "3-node cluster, R3",
        "store": "postgres",
    }
    report(
        "failover",
        [
            ("SIGKILLs of the leading scheduler", f"{kills}"),
            ("lease (a standby waits this long without a heartbeat)", f"{lease_s:g} s"),
            (
                "SIGKILL → the standby holds the lease",
                f"median {figures['takeover_median_ms']} ms, max {figures['takeover_max_ms']} ms",
            ),
            (
                "SIGKILL → the standby serves (book loaded, intents consumed)",
                f"median {figures['serving_median_ms']} ms, max {figures['serving_max_ms']} ms",
            ),
            ("bus and store", "3-node NATS cluster (R3, fsync always), one Postgres database"),
        ],
        figures,
    )


async def _wait_for(check: object, within_s: float) -> int:
    """Poll `check()` (async, truthy) every 20 ms; its first truthy value."""
    deadline = time.monotonic() + within_s
    while True:
        value = await check()  # type: ignore[operator]
        if value is not None and value is not False:
            return int(value)
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {within_s} s")
        await asyncio.sleep(0.02)


async def _any_serving(http: aiohttp.ClientSession, ports: list[int]) -> int | None:
    for i, port in enumerate(ports):
        if await _serving(http, port):
            return i
    return None


async def _serving_as(http: aiohttp.ClientSession, port: int) -> bool:
    return await _serving(http, port)


async def _ready(data_dir: Path) -> bool:
    return (data_dir / "scheduler" / "holder-local").exists()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, metavar="URL")
    args = parser.parse_args()
    asyncio.run(run(args.kills, args.postgres))


if __name__ == "__main__":
    main()
