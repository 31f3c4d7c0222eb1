"""Event streams: the time from a workload event's publish onto EVENTS (the moment the scheduler
makes a change known) to its arrival at an SSE client of `GET /v1/events`.

Runs `einsora api` as its own process (SQLite store, an embedded nats-server with
`sync_interval: always`), launches a few workloads (they stay pending: no scheduler runs), then
plays the scheduler from this process: WorkloadEvents (notes) for those workloads published at
a steady rate (100 changes/s by default, for 30 s), each awaited until JetStream acknowledges
it, as the scheduler does. `--clients K` SSE clients follow the tenant's events meanwhile; the
api's timeline consumer takes the same events into the store at the same time, as it would.
Latency is measured in this one process (one clock): from just before the publish to the
arrival of the event's frame. Figures, never pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import aiohttp
from _harness import report, summary_ms
from nats.aio.client import Client as NATS

from einsora.common.bus import connect, names, publish
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState

WORKLOADS = 20
_LISTENING = re.compile(r"listening on (http://\S+)")


def start_api(nats_url: str, data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "einsora.api.command", "--nats", nats_url),
            *("--port", "0", "--data-dir", str(data_dir)),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "EINSORA_LOG_LEVEL": "WARNING",
            "EINSORA_API_REQUESTS_PER_MINUTE": "0",
        },
    )
    assert process.stderr is not None
    for line in process.stderr:
        match = _LISTENING.search(line)
        if match:
            return process, match[1]
    raise SystemExit(f"einsora api did not start (exit {process.wait()})")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Client:
    """One SSE client of /v1/events: the arrival time of each event, by its reason."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.snapshot = asyncio.Event()

    async def follow(self, session: aiohttp.ClientSession, url: str) -> None:
        async with session.get(url + "/v1/events", headers={"Accept": "text/event-stream"}) as resp:
            assert resp.status == 200, await resp.text()
            event = ""
            async for raw in resp.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    now = time.monotonic()
                    if event == "snapshot":
                        self.snapshot.set()
                    else:
                        self.arrived[json.loads(line[6:])["reason"]] = now


async def measure(rate: float, seconds: float, clients: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats", port=0) as nats:
        data_dir = Path(tmp) / "data"
        process, url = start_api(nats.url, data_dir)
        nc = await connect(nats.url, name="bench-scheduler")
        try:
            token = (data_dir / "owner.token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=headers) as session:
                workloads = []
                for _ in range(WORKLOADS):
                    async with session.post(
                        url + "/v1/workloads", json={"kind": "notebook", "class": "cpu-1c-2g"}
                    ) as resp:
                        assert resp.status == 201, await resp.text()
                        workloads.append(await resp.json())
                followers = [Client() for _ in range(clients)]
                tasks = [asyncio.create_task(c.follow(session, url)) for c in followers]
                await asyncio.wait_for(asyncio.gather(*(c.snapshot.wait() for c in followers)), 30)
                published, cpu = await publish_events(nc, workloads, rate, seconds, process.pid)
                # Until every client has every event (or a last few seconds have passed).
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and any(
                    len(c.arrived) < len(published) for c in followers
                ):
                    await asyncio.sleep(0.05)
                for task in tasks:
                    task.cancel()
        finally:
            await nc.close()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    latencies = [
        c.arrived[key] - sent
        for c in followers
        for key, sent in published.items()
        if key in c.arrived
    ]
    missing = sum(len(published) - len(c.arrived.keys() & published.keys()) for c in followers)
    lat = summary_ms(latencies)
    figures = {
        "sse_latency_p50_ms": lat["p50"],
        "sse_latency_p99_ms": lat["p99"],
        "sse_latency_mean_ms": lat["mean"],
        "changes_per_s": rate,
        "seconds": seconds,
        "events_published": len(published),
        "sse_clients": clients,
        "events_missing_at_clients": missing,
        "api_cpu_per_event_ms": round(cpu * 1000 / max(1, len(published)), 3),
    }
    report(
        "event_stream",
        [
            ("changes published", f"{len(published):,} at {rate:g}/s for {seconds:g} s"),
            ("SSE clients of /v1/events", str(clients)),
            (
                "publish -> SSE client",
                f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, mean {lat['mean']} ms",
            ),
            ("events missing at a client", str(missing)),
            ("api CPU per event (timeline + streams)", f"{figures['api_cpu_per_event_ms']} ms"),
        ],
        figures,
    )


async def publish_events(
    nc: NATS, workloads: list[dict[str, str]], rate: float, seconds: float, pid: int
) -> tuple[dict[str, float], float]:
    """Publish notes at `rate` per second for `seconds`, as the scheduler would; the publish
    time of each (by its reason), and the api's CPU seconds meanwhile."""
    js = nc.jetstream()
    sent: dict[str, float] = {}
    seqs = dict.fromkeys((w["id"] for w in workloads), 0)
    total = int(rate * seconds)
    cpu0 = cpu_seconds(pid)
    start = time.monotonic()
    for i in range(total):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        workload = workloads[i % len(workloads)]
        seqs[workload["id"]] += 1
        seq = seqs[workload["id"]]
        reason = f"bench note {i}"
        event = WorkloadEvent(
            event_id=f"{workload['id']}-{seq}",
            workload_id=workload["id"],
            tenant_id=workload["tenant_id"],
            kind=EventKind.note,
            state=WorkloadState.pending,
            reason=reason,
            seq=seq,
        )
        sent[reason] = time.monotonic()
        await publish(
            js,
            names.event_subject(event.workload_id),
            event,
            request_id="bench",
            msg_id=event.event_id,
        )
    return sent, cpu_seconds(pid) - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="changes per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to publish")
    parser.add_argument("--clients", type=int, default=1, help="SSE clients of /v1/events")
    args = parser.parse_args()
    asyncio.run(measure(args.rate, args.seconds, args.clients))


if __name__ == "__main__":
    main()
