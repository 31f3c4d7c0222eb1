"""Usage accounting under load: report latency over 100,000 allocations, and events metered/s.

Stores 100,000 closed allocations (60 tenants, 4 classes, 3 regions, 30 days; some spanning
midnights) in accounting's store the way metering stores them (rows, day pieces, day sums,
decayed usage), runs `einsora accounting` as its own process against an embedded nats-server
(`sync_interval: always`), and measures:
- the usage report grouped by tenant and by day over the whole history, with partial days at
  both ends, ~200 requests each from one client: p50/p99. End to end through the api
  (`GET /v1/usage`, an `einsora api` process) where the api has that route, else through
  `accounting.report` (request/reply on the bus); the path measured is printed;
- events metered per second: 20,000 workload events (10,000 workloads entering `running`, then
  leaving it) waiting in EVENTS when accounting starts, timed from the moment its durable
  consumer exists until it has acknowledged the last (the publish rate, the bus's own floor
  with fsync on, is printed apart).
Targets (issue 13): report p99 <= 50 ms; >= 5,000 events/s. Figures, never pass/fail.
`--postgres [URL]` runs on a fresh Postgres database instead of SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import aiohttp
from _harness import DEFAULT_POSTGRES, fresh_postgres, report, summary_ms
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from einsora.accounting.model import Allocation
from einsora.accounting.service import EVENTS_CONSUMER
from einsora.accounting.store import AccountingStore
from einsora.accounting.testing import SchedulerPlayer, ask_report, held
from einsora.common.bus import connect, message_headers, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import ReportGroup, UsageReportRequest, WorkloadState

ALLOCATIONS = 100_000
TENANTS = 60
CLASSES = ("l40s-48gb", "a100-80gb", "h100-80gb", "cpu-4c-16g")
REGIONS = ("local", "east", "west")
DAYS = 30
REPORTS = 200
EVENT_WORKLOADS = 10_000
END = datetime(2030, 6, 1, tzinfo=UTC)
START = END - timedelta(days=DAYS)
WINDOW = (START - timedelta(hours=3, minutes=17), END + timedelta(hours=5))
"""The reports' range: the whole history, with a partial day at each end."""
API_ROUTE = Path(__file__).resolve().parent.parent / "services/api/src/einsora/api/routers/usage.py"
_LISTENING = re.compile(r"listening on (http://\S+)")


def history() -> list[Allocation]:
    rng = random.Random(13)
    made = []
    for i in range(ALLOCATIONS):
        start = START + timedelta(seconds=rng.uniform(0, DAYS * 86400 - 3 * 3600))
        length = timedelta(seconds=min(rng.expovariate(1 / 14400), 2 * 86400))
        klass = CLASSES[i % len(CLASSES)]
        gpus = 0 if klass.startswith("cpu") else rng.choice((1, 1, 2, 4, 8))
        machine = f"m-{i % 200}"
        made.append(
            Allocation(
                workload_id=f"w-bench{i:07d}",
                tenant_id=f"t-{i % TENANTS:03d}",
                kind="notebook",
                class_name=klass,
                placed_class=klass,
                region=REGIONS[i % len(REGIONS)],
                machine=machine,
                gpus=[f"GPU-{machine}-{k}" for k in range(gpus)],
                cpus=float(rng.choice((2, 4, 8, 16))),
                memory_mib=16384,
                started_at=start,
                ended_at=start + length,
                opened_by_event=f"w-bench{i:07d}-1",
                closed_by_event=f"w-bench{i:07d}-2",
            )
        )
    return made


async def fill(database_url: str) -> float:
    store = AccountingStore(database_url)
    try:
        await store.migrate()
        made = history()
        t0 = time.perf_counter()
        for i in range(0, len(made), 2000):
            await store.import_closed(made[i : i + 2000], 24.0)
        return time.perf_counter() - t0
    finally:
        await store.close()


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """A service as its own process, its log in `log` (shown if the benchmark fails)."""
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            stderr=out,
            text=True,
            env={**os.environ, "EINSORA_LOG_LEVEL": "WARNING", **env},
        )


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_api(
    nats_url: str, data_dir: Path, database_url: str, log: Path
) -> tuple[subprocess.Popen[str], str]:
    process = spawn(
        [
            "einsora.api.command",
            "--nats",
            nats_url,
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--database-url",
            database_url,
        ],
        {"EINSORA_API_REQUESTS_PER_MINUTE": "0"},
        log,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        match = _LISTENING.search(log.read_text())
        if match:
            return process, match[1]
        time.sleep(0.05)
    raise SystemExit(f"einsora api did not start; see {log}")


async def until_consuming(js: JetStreamContext, process: subprocess.Popen[str]) -> None:
    while True:
        try:
            await js.consumer_info(names.EVENTS.name, EVENTS_CONSUMER)
            return
        except NotFoundError:
            if process.poll() is not None:
                raise SystemExit("einsora accounting exited at start") from None
            await asyncio.sleep(0.05)


async def via_bus(nc: NATS, group: ReportGroup) -> tuple[list[float], int]:
    request = UsageReportRequest.model_validate(
        {"group_by": group, "from": WINDOW[0], "to": WINDOW[1], "now": END}
    )
    samples, items = [], 0
    for _ in range(REPORTS):
        t0 = time.perf_counter()
        reply = await ask_report(nc, request)
        samples.append(time.perf_counter() - t0)
        if reply.error:
            raise SystemExit(f"accounting answered: {reply.error}")
        items = len(reply.items)
    return samples, items


async def via_api(
    session: aiohttp.ClientSession, url: str, group: ReportGroup
) -> tuple[list[float], int]:
    params = {"from": WINDOW[0].isoformat(), "to": WINDOW[1].isoformat(), "group_by": group.value}
    samples, items = [], 0
    for _ in range(REPORTS):
        t0 = time.perf_counter()
        async with session.get(url + "/v1/usage", params=params) as resp:
            body = await resp.json()
        samples.append(time.perf_counter() - t0)
        if resp.status != 200:
            raise SystemExit(f"GET /v1/usage answered {resp.status}: {body}")
        items = len(body["items"])
    return samples, items


async def publish_events(js: JetStreamContext) -> float:
    """Publish the workload events to meter (10,000 workloads entering `running`, then
    leaving it), before accounting runs; how long publishing took."""
    player = SchedulerPlayer(js)
    events = []
    for i in range(EVENT_WORKLOADS):
        w = new_id("workload")
        tenant = f"t-{i % TENANTS:03d}"
        at = END + timedelta(seconds=i)
        what = held(1 + i % 4, machine=f"m-{i % 200}")
        events.append(player.event(w, WorkloadState.running, at, tenant_id=tenant, metered=what))
        events.append(
            player.event(w, WorkloadState.parking, at + timedelta(hours=1), tenant_id=tenant)
        )
    t0 = time.perf_counter()
    pending: list[asyncio.Future[PubAck]] = []
    for e in events:
        headers = message_headers(request_id=e.event_id, msg_id=e.event_id)
        subject = names.event_subject(e.workload_id)
        pending.append(await js.publish_async(subject, e.to_bytes(), headers=headers))
        if len(pending) >= 1000:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)
    return time.perf_counter() - t0


async def meter_events(js: JetStreamContext, process: subprocess.Popen[str]) -> float:
    """Events metered per second: from the moment accounting's consumer exists (it starts
    from the stream's first event) until it has acknowledged the last."""
    await until_consuming(js, process)
    t0 = time.perf_counter()
    while True:
        info = await js.consumer_info(names.EVENTS.name, EVENTS_CONSUMER)
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return 2 * EVENT_WORKLOADS / (time.perf_counter() - t0)
        await asyncio.sleep(0.005)


async def measure(database_url: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats", port=0) as nats:
        data_dir = Path(tmp) / "data"
        logs = {"accounting": Path(tmp) / "accounting.log", "api": Path(tmp) / "api.log"}
        url = database_url or f"sqlite+aiosqlite:///{data_dir / 'einsora.db'}"
        nc = await connect(nats.url, name="bench")
        js = nc.jetstream()
        await provision(js)
        progress(f"storing {ALLOCATIONS:,} closed allocations ...")
        fill_s = await fill(url)
        progress(f"publishing {2 * EVENT_WORKLOADS:,} workload events ...")
        publish_s = await publish_events(js)
        progress("metering them ...")
        accounting = spawn(
            [
                "einsora.accounting",
                "--nats",
                nats.url,
                "--data-dir",
                str(data_dir),
                "--database-url",
                url,
            ],
            {},
            logs["accounting"],
        )
        api: subprocess.Popen[str] | None = None
        try:
            rate = await meter_events(js, accounting)
            if API_ROUTE.exists():
                api, api_url = start_api(nats.url, data_dir, url, logs["api"])
                path = "GET /v1/usage (einsora api, then accounting.report)"
                token = (data_dir / "owner.token").read_text().strip()
                headers = {"Authorization": f"Bearer {token}"}
                progress(f"measuring {path} ...")
                async with aiohttp.ClientSession(headers=headers) as session:
                    await via_api(session, api_url, ReportGroup.tenant)  # warm up
                    by_tenant, tenant_items = await via_api(session, api_url, ReportGroup.tenant)
                    by_day, day_items = await via_api(session, api_url, ReportGroup.day)
            else:
                path = "accounting.report (request/reply on the bus; the api has no GET /v1/usage)"
                progress(f"measuring {path} ...")
                await via_bus(nc, ReportGroup.tenant)  # warm up
                by_tenant, tenant_items = await via_bus(nc, ReportGroup.tenant)
                by_day, day_items = await via_bus(nc, ReportGroup.day)
        except BaseException:
            for name, log in logs.items():
                if log.exists():
                    progress(f"--- {name} log (tail) ---\n" + log.read_text()[-4000:])
            raise
        finally:
            for process in (api, accounting):
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=30)
            await nc.close()
    tenant, day = summary_ms(by_tenant), summary_ms(by_day)
    store = "postgres" if database_url else "sqlite"
    figures = {
        "path": path.split(" (")[0],
        "report_by_tenant_p50_ms": tenant["p50"],
        "report_by_tenant_p99_ms": tenant["p99"],
        "report_by_day_p50_ms": day["p50"],
        "report_by_day_p99_ms": day["p99"],
        "report_by_tenant_items": tenant_items,
        "report_by_day_items": day_items,
        "events_metered_per_s": round(rate),
        "events_published_per_s": round(2 * EVENT_WORKLOADS / publish_s),
        "allocations_in_store": ALLOCATIONS,
        "allocations_stored_per_s": round(ALLOCATIONS / fill_s),
        "store": store,
    }
    report(
        "usage" if database_url is None else "usage-postgres",
        [
            ("store", "Postgres (asyncpg)" if database_url else "SQLite (the Solo default)"),
            ("path measured", path),
            (
                f"closed allocations stored ({ALLOCATIONS:,})",
                f"{ALLOCATIONS / fill_s:,.0f}/s with pieces, day sums and decay",
            ),
            (
                f"report by tenant ({REPORTS}, one client, {tenant_items} groups)",
                f"p50 {tenant['p50']} ms, p99 {tenant['p99']} ms (target p99 <= 50)",
            ),
            (
                f"report by day ({REPORTS}, one client, {day_items} groups)",
                f"p50 {day['p50']} ms, p99 {day['p99']} ms (target p99 <= 50)",
            ),
            (
                f"events metered ({2 * EVENT_WORKLOADS:,}, waiting in EVENTS)",
                f"{rate:,.0f}/s (target >= 5,000)",
            ),
            (
                "  publishing them beforehand (the bus, fsync on)",
                f"{2 * EVENT_WORKLOADS / publish_s:,.0f}/s",
            ),
        ],
        figures,
    )


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


if __name__ == "__main__":
    asyncio.run(main())
