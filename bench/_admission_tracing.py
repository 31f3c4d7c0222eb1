"""`bench/admission.py --tracing`: a sink for the services' spans, and the table that compares
a run with tracing off against one with it on (ADR-0020)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from _harness import report
from aiohttp import web


@contextlib.asynccontextmanager
async def otlp_sink() -> AsyncIterator[str]:
    """An OTLP/HTTP endpoint that takes every export and keeps nothing: the services pay for
    making, batching, encoding and sending their spans, as against a real collector."""

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def compare_tracing(rounds: dict[str, list[dict[str, object]]], endpoint: str) -> None:
    """The table and JSON line of a `--tracing compare` run: admissions/s off and on."""

    def mean(mode: str, key: str) -> float:
        values = [float(str(r[key])) for r in rounds[mode] if r.get(key) is not None]
        return sum(values) / len(values) if values else float("nan")

    off, on = mean("off", "admissions_per_s"), mean("on", "admissions_per_s")
    change = (on - off) / off * 100 if off else float("nan")
    figures = {
        "rounds": len(rounds["on"]),
        "admissions_per_s_tracing_off": round(off),
        "admissions_per_s_tracing_on": round(on),
        "admissions_change_percent": round(change, 1),
        "each_off": [r["admissions_per_s"] for r in rounds["off"]],
        "each_on": [r["admissions_per_s"] for r in rounds["on"]],
        "paced_latency_p50_ms_off": mean("off", "paced_latency_p50_ms"),
        "paced_latency_p50_ms_on": mean("on", "paced_latency_p50_ms"),
        "scheduler_cpu_ms_per_admission_off": mean("off", "scheduler_cpu_ms_per_admission"),
        "scheduler_cpu_ms_per_admission_on": mean("on", "scheduler_cpu_ms_per_admission"),
        "api_cpu_ms_per_admission_off": mean("off", "api_cpu_ms_per_admission"),
        "api_cpu_ms_per_admission_on": mean("on", "api_cpu_ms_per_admission"),
        # The SDK's own reading of these; unset, every trace is recorded (parentbased_always_on).
        "sampler": os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
        "sampler_arg": os.environ.get("OTEL_TRACES_SAMPLER_ARG"),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    report(
        "admission-tracing",
        [
            ("rounds (off, then on, in one sitting)", str(figures["rounds"])),
            ("admissions/s, tracing off", f"{off:,.0f} ({figures['each_off']})"),
            ("admissions/s, tracing on", f"{on:,.0f} ({figures['each_on']})"),
            ("change with tracing on", f"{change:+.1f} %"),
            (
                "scheduler CPU per admission, off / on",
                f"{figures['scheduler_cpu_ms_per_admission_off']:.3f} / "
                f"{figures['scheduler_cpu_ms_per_admission_on']:.3f} ms",
            ),
            (
                "api CPU per admission, off / on",
                f"{figures['api_cpu_ms_per_admission_off']:.3f} / "
                f"{figures['api_cpu_ms_per_admission_on']:.3f} ms",
            ),
            (
                "sampler (OTEL_TRACES_SAMPLER, _ARG)",
                f"{figures['sampler']} {figures['sampler_arg']}",
            ),
            ("spans exported to", f"{endpoint} (a sink that keeps nothing)"),
            ("load average (1 min) at the end", str(figures["load_average_1m"])),
        ],
        figures,
    )
