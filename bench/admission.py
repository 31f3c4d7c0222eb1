"""Admission: how fast launches through the API become desired state, on 1,000 sim machines.

Runs a real embedded nats-server, a real `einsora api` (SQLite), a real `einsora scheduler`
(SQLite) and a real sim agent hosting 1,000 machines (`einsora agent --sim-machines 1000`), then
measures a burst of 5,000 `POST /v1/workloads` (admission throughput, and latency from the 201
to the workload appearing in its machine's desired state, the moment its agent can see it,
p50 and p99) and launches paced at 100/s (the same latency, unloaded), beside `bench/bus.py`'s
floor. With the agent it also measures launch → the agent reporting the workload observed.

- `--direct` publishes intents straight onto INTENTS (what the api's outbox relay does), to
  measure the scheduler alone; the clock then starts at JetStream's ack.
- `--kv-machines` writes 1,000 inventories into KV instead of running the agent (no heartbeats,
  so the scheduler then runs with long silence limits).
- `--steady` skips the burst: only the paced phase, at a steady rate on an idle system.
- `--postgres [URL]` runs the api and the scheduler on one fresh Postgres database (their
  tables are apart, as in a Lab cell) instead of a SQLite file each.
- `--deep` measures what one admission costs the scheduler as its queue deepens: 20,000
  launches queued onto machines that fit 1,000, fair share on, then capacity freed in steps
  (`_admission_deep.py`: the decision path alone, in this process). The goal: the cost per
  admission at 1,000, 5,000 and 20,000 queued within 1.5x of a shallow queue's (ADR-0030).
- `--tracing on` turns OpenTelemetry on in every service (OTLP/HTTP to a sink in this process
  that keeps nothing); `--tracing compare` runs the whole measurement with tracing off, then on,
  `--rounds` times in one sitting, and ends with both admissions/s and the change (ADR-0020).

The same run measures the bus's durable-write ceiling first (pipelined JetStream publishes per
second to a scratch stream, `sync_interval: always`, as every stream here is) and what an atomic
batch's commit costs in that unit (bus/batch.py: a burst's intents and events go out in such
batches), then counts the JetStream messages stored per admission during the burst (heartbeats
included), by stream, and the durable writes they took, each atomic batch counted at its measured
cost, so the figure can be read against the physical limit: ceiling / writes per admission.
The paced phase starts only once the burst is digested (no intent, event or outbox row left to
process).

It also says where the burst's time went: how fast the launches were answered (the api's 201,
or JetStream's ack with `--direct`) beside how fast they were placed, how busy each process was
(cores: CPU seconds over the burst's seconds; a total well under the machine's cores means the
path waits rather than computes), and the scheduler's and the api's CPU per admission (CPU time
varies much less than throughput when the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import aiohttp
from _admission_deep import run as deep_queue
from _admission_seams import (
    API_CLIENTS,
    API_LIMITS_OFF,
    ApiLauncher,
    DesiredObserver,
    IntentLauncher,
    KvObserver,
    KvSimMachines,
    Launcher,
    enrol,
    sim_machine_ids,
)
from _admission_tracing import compare_tracing, otlp_sink
from _bus_figures import (
    batch_cost,
    batched_runs,
    durable_write_ceiling,
    stored_by_stream,
    until_digested,
)
from _harness import DEFAULT_POSTGRES, fresh_postgres, load, report, summary_ms

from einsora.agent.identity import sim_machine_ids as agent_machine_ids
from einsora.common.bus import connect, names, provision
from einsora.common.bus.provision import ATOMIC_BATCHES
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id

GPU_SHARE = 0.6  # of launches ask for one l40s-48gb; the rest for cpu-2c-4g


async def _until(condition: Callable[[], bool], within_s: float, what: str) -> None:
    """Wait for `condition()` with a deadline (a benchmark may poll)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _class_of(i: int) -> str:
    return "l40s-48gb" if i % 5 < GPU_SHARE * 5 else "cpu-2c-4g"


_TRACING_ENV: dict[str, str] = {}
"""The OTEL_* variables every service of the run gets (`--tracing`: tracing on)."""


def _spawn(tmp: str, url: str, *args: str, sim_machines: bool = False) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).parent / "einsora"), *args, "--nats", url]
    env = {**os.environ, "EINSORA_LOG_LEVEL": "WARNING", **API_LIMITS_OFF, **_TRACING_ENV}
    if sim_machines:
        env["EINSORA_SIM_MACHINES"] = "true"
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _api_launcher(
    tmp: str, url: str, processes: list[subprocess.Popen[bytes]], database_url: str | None
) -> Launcher:
    """Start `einsora api` on this bus (its own SQLite store, or `database_url`) and launch
    through it."""
    port = _free_port()
    data = Path(tmp) / "api"
    processes.append(
        _spawn(
            tmp,
            url,
            "api",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--database-url",
            database_url or f"sqlite+aiosqlite:///{data}/api.db",
        )
    )
    token_file = data / "owner.token"
    await _until(token_file.exists, 60, "the api's owner token")
    base = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(f"{base}/readyz") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    deadline = time.perf_counter() + 60
    while not await ready():
        if time.perf_counter() > deadline:
            raise RuntimeError("einsora api did not become ready")
        await asyncio.sleep(0.05)
    return ApiLauncher(base, token_file.read_text().strip())


async def _launch_all(launcher: Launcher, count: int, rate: float | None = None) -> list[str]:
    """Launch `count` workloads (at `rate` per second if given); the ids that were accepted."""
    before = set(launcher.launched)
    t0 = time.perf_counter()
    for i in range(count):
        if rate is not None:
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await launcher.launch(new_id("workload"), _class_of(i))
    await launcher.settle()
    return [w for w in launcher.launched if w not in before]


async def run(
    machines: int,
    burst: int,
    rate: float,
    paced: int,
    agent: bool,
    direct: bool,
    database_url: str | None = None,
    name: str | None = None,
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats", port=0) as server:
        nc = await connect(server.url, name="bench-admission")
        js = nc.jetstream()
        ceiling = await durable_write_ceiling(js)
        cost = await batch_cost(nc, js)
        await provision(js)
        kv = await js.key_value(names.MACHINES.name)
        observer: DesiredObserver = KvObserver(kv, "desired")
        reported = KvObserver(kv, "observed")
        processes: list[subprocess.Popen[bytes]] = []
        launcher: Launcher = (
            IntentLauncher(nc, js)
            if direct
            else await _api_launcher(tmp, server.url, processes, database_url)
        )
        # The bench plays the api's enrolment of the machines (the agent's ids are its own),
        # as the launching tenant's own (private) machines.
        await enrol(
            js,
            agent_machine_ids("m-sim", machines) if agent else sim_machine_ids(machines),
            await launcher.tenant(),
        )
        silence = [] if agent else ["--suspect-after", "3600", "--lost-after", "7200"]
        database = database_url or f"sqlite+aiosqlite:///{tmp}/scheduler.db"
        if agent:
            processes.append(
                _spawn(
                    tmp,
                    server.url,
                    "agent",
                    "--machine-id",
                    "m-sim",
                    "--sim-machines",
                    str(machines),
                    "--sim-inventory",
                    "4x l40s-48gb, 64 cpu, 512 GiB",
                    "--sim-start-delay",
                    "0",
                    "--data-dir",
                    f"{tmp}/agent",
                )
            )
        else:
            await KvSimMachines(kv).join(machines)
        # Its machines are sim machines: the scheduler's cell allows them (issue 34, N9).
        scheduler = _spawn(
            tmp, server.url, "scheduler", "--database-url", database, *silence, sim_machines=True
        )
        processes.append(scheduler)
        try:
            await observer.start()
            await _until(lambda: len(observer.machines) >= machines, 120, "machines known")

            burst_s = burst_cpu = api_cpu = answered_s = 0.0
            cores: dict[str, float] = {}
            by_stream: dict[str, float] = {}
            burst_lat: dict[str, float | None] = {"p50": None, "p99": None}
            writes = durable = 0.0
            batches: list[int] = []
            if burst:
                stored0 = await stored_by_stream(js)
                pids = {"scheduler": scheduler.pid, "nats-server": server.pid or 0}
                if not direct:
                    pids["api"] = processes[0].pid
                if agent:
                    pids["agent"] = processes[-2].pid
                busy0 = {name: _cpu_seconds(pid) for name, pid in pids.items()}
                busy0["bench"] = time.process_time()
                cpu0 = _cpu_seconds(scheduler.pid)
                api_cpu0 = _cpu_seconds(processes[0].pid) if not direct else 0.0
                start = time.perf_counter()
                ids = await _launch_all(launcher, burst)
                await _until(lambda: all(w in observer.seen for w in ids), 300, "burst placed")
                burst_s = max(observer.seen[w] for w in ids) - start
                answered_s = max(launcher.launched[w] for w in ids) - start
                burst_cpu = _cpu_seconds(scheduler.pid) - cpu0
                busy = {name: _cpu_seconds(pid) - busy0[name] for name, pid in pids.items()}
                busy["bench"] = time.process_time() - busy0["bench"]
                cores = {name: round(s / burst_s, 2) for name, s in busy.items()}
                burst_lat = {**summary_ms([observer.seen[w] - launcher.launched[w] for w in ids])}
                await until_digested(js)
                if not direct:  # the timeline's share comes in as the burst is digested
                    api_cpu = _cpu_seconds(processes[0].pid) - api_cpu0
                stored1 = await stored_by_stream(js)
                by_stream = {
                    name: round((n - stored0.get(name, 0)) / burst, 2)
                    for name, n in sorted(stored1.items())
                    if n != stored0.get(name, 0)
                }
                writes = sum(stored1.values()) - sum(stored0.values())
                durable = writes
                for stream in ATOMIC_BATCHES:
                    _, sizes = await batched_runs(js, stream.name, stored0.get(stream.name, 0))
                    batches += sizes
                    durable += sum(cost.writes(n, ceiling) - n for n in sizes)
            if agent:
                # Watching every observed key parses each agent's complete state: on 2 cores
                # that would take CPU from the system measured, so only the paced phase does.
                await reported.start()

            paced_ids = await _launch_all(launcher, paced, rate)
            await _until(lambda: all(w in observer.seen for w in paced_ids), 60, "paced placed")
            paced_lat = summary_ms([observer.seen[w] - launcher.launched[w] for w in paced_ids])
            if agent:
                await _until(lambda: all(w in reported.seen for w in paced_ids), 60, "reported")
                paced_agent = summary_ms(
                    [reported.seen[w] - launcher.launched[w] for w in paced_ids]
                )
        finally:
            if isinstance(launcher, ApiLauncher):
                await launcher.close()
            await observer.stop()
            await reported.stop()
            for process in reversed(processes):
                process.terminate()
                process.wait(30)
            await nc.close()

    throughput = burst / burst_s if burst else 0.0
    stored_per_admission = writes / burst if burst else None
    per_admission = durable / burst if burst else None
    bound = ceiling / per_admission if per_admission else None
    fraction = throughput / bound if bound else None
    bus = load("bus")
    figures = {
        "machines": machines,
        "burst": burst,
        "admissions_per_s": round(throughput),
        "durable_write_ceiling_per_s": round(ceiling),
        "batch_commit_fixed_ms": round(cost.fixed_s * 1000, 3),
        "batch_commit_per_message_ms": round(cost.per_message_s * 1000, 4),
        "messages_stored_per_admission": (
            round(stored_per_admission, 2) if stored_per_admission else None
        ),
        "messages_stored_per_admission_by_stream": by_stream,
        "atomic_batches": len(batches),
        "messages_in_atomic_batches": sum(batches),
        "durable_writes_per_admission": round(per_admission, 2) if per_admission else None,
        "admission_bound_per_s": round(bound) if bound else None,
        "fraction_of_bound": round(fraction, 3) if fraction else None,
        "burst_latency_p50_ms": burst_lat["p50"],
        "burst_latency_p99_ms": burst_lat["p99"],
        "scheduler_cpu_ms_per_admission": round(burst_cpu / burst * 1000, 3) if burst else None,
        "api_cpu_ms_per_admission": (
            round(api_cpu / burst * 1000, 3) if burst and not direct else None
        ),
        "launches_answered_per_s": round(burst / answered_s) if answered_s else None,
        "burst_cores_by_process": cores,
        "burst_cores_total": round(sum(cores.values()), 2),
        "paced_rate_per_s": rate,
        "paced_latency_p50_ms": paced_lat["p50"],
        "paced_latency_p99_ms": paced_lat["p99"],
        "machines_from": "sim agent" if agent else "inventories in KV",
        "launches_via": "intents" if direct else "api",
        "store": "postgres" if database_url else "sqlite",
        "api_clients": None if direct else API_CLIENTS,
        "bus_kv_watch_p50_ms": bus["kv_watch_p50_ms"] if bus else None,
        "bus_kv_watch_p99_ms": bus["kv_watch_p99_ms"] if bus else None,
        "bus_js_publish_pipelined_per_s": bus["js_publish_pipelined_per_s"] if bus else None,
    }
    agent_rows: list[tuple[str, str]] = []
    if agent:
        figures |= {
            "paced_to_agent_report_p50_ms": paced_agent["p50"],
            "paced_to_agent_report_p99_ms": paced_agent["p99"],
        }
        agent_rows = [
            (
                "paced: launch → the agent reports it",
                f"p50 {paced_agent['p50']} ms, p99 {paced_agent['p99']} ms",
            ),
        ]
    floor = (
        f"KV put→watch p50 {bus['kv_watch_p50_ms']} ms, p99 {bus['kv_watch_p99_ms']} ms; "
        f"publish {bus['js_publish_pipelined_per_s']:,}/s pipelined"
        if bus
        else "not measured on this checkout (run bench/bus.py first)"
    )
    figures["tracing"] = "on (OTLP/HTTP to a local sink)" if _TRACING_ENV else "off"
    report(
        name or ("admission" if database_url is None else "admission-postgres"),
        [
            ("sim machines (4x l40s-48gb, 64 cpu each)", f"{machines:,}"),
            (
                f"burst of {burst:,} launches ({GPU_SHARE:.0%} l40s-48gb, rest cpu-2c-4g)",
                f"{throughput:,.0f} admissions/s ({burst_s:.2f} s)",
            ),
            (
                "  launches answered (201, or JetStream's ack with --direct)",
                f"{burst / answered_s:,.0f}/s" if answered_s else "-",
            ),
            (
                "  launch → in desired state",
                f"p50 {burst_lat['p50']} ms, p99 {burst_lat['p99']} ms",
            ),
            ("  scheduler CPU per admission", f"{burst_cpu / max(burst, 1) * 1000:.3f} ms"),
            (
                "  api CPU per admission (until digested)",
                "-" if direct else f"{api_cpu / max(burst, 1) * 1000:.3f} ms",
            ),
            (
                "  cores busy during the burst",
                ", ".join(f"{name} {c:.2f}" for name, c in cores.items())
                + f"; {sum(cores.values()):.2f} of {os.cpu_count()}",
            ),
            (
                "durable-write ceiling (pipelined JetStream publishes, fsync each)",
                f"{ceiling:,.0f}/s",
            ),
            (
                "  an atomic batch of n messages costs (measured alone)",
                f"{cost.fixed_s * 1000:.2f} ms + n x {cost.per_message_s * 1000:.4f} ms",
            ),
            (
                "  JetStream messages stored per admission (heartbeats included)",
                f"{stored_per_admission:.2f}" if stored_per_admission else "-",
            ),
            (
                "    by stream",
                ", ".join(f"{name} {n:.2f}" for name, n in by_stream.items()) or "-",
            ),
            (
                "    of them in atomic batches",
                f"{sum(batches):,} in {len(batches):,} batches" if burst else "-",
            ),
            (
                "  durable writes per admission (a batch counted at its cost)",
                f"{per_admission:.2f}" if per_admission else "-",
            ),
            (
                "  admissions the bus allows (ceiling / writes per admission)",
                f"{bound:,.0f}/s; this run reached {fraction:.0%}" if bound and fraction else "-",
            ),
            (
                f"paced at {rate:g}/s ({paced:,} launches)",
                f"p50 {paced_lat['p50']} ms, p99 {paced_lat['p99']} ms",
            ),
            ("bus floor (bench/bus.py)", floor),
            *agent_rows,
            (
                "launches via",
                "intents straight onto INTENTS (--direct)"
                if direct
                else f"POST /v1/workloads to `einsora api`, {API_CLIENTS} in flight "
                "(clock starts at the 201)",
            ),
            ("seen via", "a watch on the machines' desired keys, as each agent watches its own"),
            ("machines from", "a sim agent process" if agent else "inventories written to KV"),
            ("stores", "one Postgres database" if database_url else "a SQLite file each"),
            ("tracing", str(figures["tracing"])),
        ],
        figures,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=100.0, help="paced launches per second")
    parser.add_argument("--paced", type=int, default=1000, help="paced launches")
    parser.add_argument(
        "--kv-machines",
        action="store_true",
        help="write machines' inventories to KV instead of running a sim agent process",
    )
    parser.add_argument(
        "--postgres",
        nargs="?",
        const=DEFAULT_POSTGRES,
        metavar="URL",
        help=f"a Postgres server to make a fresh database on (default {DEFAULT_POSTGRES})",
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help="no burst: only the paced phase, on an idle system",
    )
    parser.add_argument(
        "--tracing",
        choices=("off", "on", "compare"),
        default="off",
        help="OpenTelemetry in every service (on: OTLP/HTTP to a sink in this process); "
        "compare: the whole run with tracing off, then on, --rounds times, in one sitting",
    )
    parser.add_argument("--rounds", type=int, default=1, help="with --tracing compare")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="publish intents onto INTENTS instead of POSTing to the api",
    )
    parser.add_argument(
        "--deep",
        action="store_true",
        help="only the deep-queue case: the scheduler's cost per admission at 100, 1,000, "
        "5,000 and 20,000 queued",
    )
    args = parser.parse_args()
    if args.deep:
        rows, figures = deep_queue()
        report("admission-deep", rows, figures)
        return
    burst = 0 if args.steady else args.burst
    options = (args.machines, burst, args.rate, args.paced, not args.kv_machines, args.direct)

    async def one(name: str | None = None) -> dict[str, object]:
        if args.postgres is None:
            return await run(*options, name=name)
        async with fresh_postgres(args.postgres) as database_url:
            return await run(*options, database_url=database_url, name=name)

    async def main_async() -> None:
        if args.tracing == "off":
            await one()
            return
        async with otlp_sink() as endpoint:
            traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "1000"}
            if args.tracing == "on":
                _TRACING_ENV.update(traced)
                await one()
                return
            rounds: dict[str, list[dict[str, object]]] = {"off": [], "on": []}
            for _ in range(args.rounds):
                for mode in ("off", "on"):
                    _TRACING_ENV.clear()
                    if mode == "on":
                        _TRACING_ENV.update(traced)
                    rounds[mode].append(await one(f"admission-tracing-{mode}"))
            compare_tracing(rounds, endpoint)

    asyncio.run(main_async())


if __name__ == "__main__":
    main()
