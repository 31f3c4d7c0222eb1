"""The dashboard in a browser: the workloads list with 1,000 workloads, a change reaching its row,
and the bundle's size (issue 18).

Runs `einsora api` as its own process (SQLite store, an embedded nats-server with
`sync_interval: always`), serving the built dashboard (`make dashboard`), launches 1,000
workloads (they stay pending: no scheduler runs), and signs Debian's Chromium (Playwright,
headless) in with a one-time link. Then:
- navigation: the list page loaded afresh, from the navigation's start (the browser's
  `performance.now()`) to all 1,000 rows in the document: the page, its script, the session,
  every page of GET /v1/workloads, the event stream opened, the rows rendered. The first load
  (nothing cached) is reported apart from the later ones (the hashed assets cached);
- a change to a row: this process plays the scheduler and publishes a transition onto EVENTS
  for one workload at a time (pending -> queued); the browser notes when that row's state
  changes in the document and at the next frame after. Latency is from just before the publish
  (wall clock) to the browser's `Date.now()` then (one machine: one clock);
- the bundle: the built JavaScript (and CSS) gzipped, as a browser fetches it.
Targets on this 2-core machine: list <= 1 s, row update <= 100 ms, JS <= 200 KB gzipped.
Figures, never pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import aiohttp
from _harness import report, summary_ms
from nats.aio.client import Client as NATS

from einsora.common.bus import connect, names, publish
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dashboard" / "dist"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_LISTENING = re.compile(r"listening on (http://\S+)")

# Installed before the page's own script (through the DevTools protocol, which the page's CSP
# does not govern): the moment the document holds every row, and each row's state changes.
WATCH = """
(() => {
  window.__rows = null;
  window.__changed = {};
  const wanted = %d;
  const rows = document.getElementsByTagName("tr");
  new MutationObserver((records) => {
    const now = Date.now();
    if (window.__rows === null && rows.length > wanted) window.__rows = performance.now();
    for (const r of records) {
      if (r.type !== "attributes" || r.attributeName !== "data-state") continue;
      const el = r.target;
      const id = el.dataset.workload;
      if (el.dataset.state === "queued" && !(id in window.__changed)) {
        const seen = (window.__changed[id] = { dom: now, frame: null });
        requestAnimationFrame(() => { seen.frame = Date.now(); });
      }
    }
  }).observe(document, { childList: true, subtree: true, attributes: true,
                          attributeFilter: ["data-state"] });
})();
"""


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
            "EINSORA_API_LAUNCHES_PER_MINUTE": "0",
            "EINSORA_TENANT_MAX_WORKLOADS": "0",
            "EINSORA_DASHBOARD_DIR": str(DIST),
        },
    )
    assert process.stderr is not None
    for line in process.stderr:
        match = _LISTENING.search(line)
        if match:
            return process, match[1]
    raise SystemExit(f"einsora api did not start (exit {process.wait()})")


def bundle_kb() -> tuple[float, float, float]:
    """The built JavaScript gzipped, its raw size, and the CSS gzipped, in KB."""
    js = [p.read_bytes() for p in (DIST / "assets").glob("*.js")]
    css = [p.read_bytes() for p in (DIST / "assets").glob("*.css")]
    return (
        sum(len(gzip.compress(b, 9)) for b in js) / 1024,
        sum(len(b) for b in js) / 1024,
        sum(len(gzip.compress(b, 9)) for b in css) / 1024,
    )


async def launch(session: aiohttp.ClientSession, url: str, count: int) -> list[dict[str, Any]]:
    """`count` workloads, 16 launches at a time."""
    made: list[dict[str, Any]] = []
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with gate:
            body = {"kind": "notebook", "class": "cpu-1c-2g", "name": f"bench-{i:04d}"}
            async with session.post(url + "/v1/workloads", json=body) as resp:
                assert resp.status == 201, await resp.text()
                made.append(await resp.json())

    await asyncio.gather(*(one(i) for i in range(count)))
    return made


async def navigations(page: Any, url: str, count: int, rounds: int) -> list[float]:
    """Milliseconds from each navigation's start to every row in the document."""
    took = []
    for _ in range(rounds):
        await page.goto(url + "/workloads", wait_until="commit")
        await page.wait_for_function("() => window.__rows !== null", timeout=60_000)
        took.append(float(await page.evaluate("window.__rows")))
        shown = await page.evaluate("document.querySelectorAll('tr[data-workload]').length")
        assert shown == count, f"{shown} rows, not {count}"
    return took


async def row_updates(
    page: Any, nc: NATS, workloads: list[dict[str, Any]], changes: int, rate: float
) -> tuple[list[float], list[float]]:
    """Latencies (s) from a transition's publish to its row changing, and to the next frame."""
    await page.wait_for_function(
        "() => document.querySelector('.live-live') !== null", timeout=30_000
    )  # the stream is open
    js = nc.jetstream()
    sent: dict[str, float] = {}
    start = time.monotonic()
    for i, workload in enumerate(workloads[:changes]):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        event = WorkloadEvent(
            event_id=f"{workload['id']}-1",
            workload_id=workload["id"],
            tenant_id=workload["tenant_id"],
            kind=EventKind.transition,
            state=WorkloadState.queued,
            reason="no machine has room (bench)",
            seq=1,
        )
        sent[workload["id"]] = time.time()
        await publish(
            js,
            names.event_subject(event.workload_id),
            event,
            request_id="bench",
            msg_id=event.event_id,
        )
    deadline = time.monotonic() + 20
    changed: dict[str, dict[str, float | None]] = {}
    while time.monotonic() < deadline:
        changed = await page.evaluate("window.__changed")
        if len(changed) >= len(sent) and all(c["frame"] for c in changed.values()):
            break
        await asyncio.sleep(0.1)
    dom = [changed[w]["dom"] / 1000 - at for w, at in sent.items() if w in changed]  # type: ignore[operator]
    frame = [
        changed[w]["frame"] / 1000 - at  # type: ignore[operator]
        for w, at in sent.items()
        if w in changed and changed[w]["frame"]
    ]
    missing = len(sent) - len(dom)
    if missing:
        print(f"warning: {missing} changes never reached their row", file=sys.stderr)
    return dom, frame


async def measure(count: int, rounds: int, changes: int, rate: float) -> None:
    from playwright.async_api import async_playwright

    js_gz, js_raw, css_gz = bundle_kb()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats", port=0) as nats:
        data_dir = Path(tmp) / "data"
        process, url = start_api(nats.url, data_dir)
        nc = await connect(nats.url, name="bench-scheduler")
        try:
            token = (data_dir / "owner.token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=headers) as session:
                t0 = time.monotonic()
                workloads = await launch(session, url, count)
                launched_s = time.monotonic() - t0
                async with session.post(url + "/v1/sign-in-links", json={}) as resp:
                    link = (await resp.json())["path"]
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                )
                context = await browser.new_context(viewport={"width": 1280, "height": 900})
                await context.add_init_script(WATCH % count)
                page = await context.new_page()
                await page.goto(url + link)  # signs in, then shows the list (cold caches)
                await page.wait_for_function("() => window.__rows !== null", timeout=60_000)
                cold = float(await page.evaluate("window.__rows"))
                warm = await navigations(page, url, count, rounds)
                # Ordered by age: the newest launches are the rows at the top.
                newest = sorted(workloads, key=lambda w: w["created_at"], reverse=True)
                dom, frame = await row_updates(page, nc, newest, changes, rate)
                await browser.close()
        finally:
            await nc.close()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    nav = summary_ms([t / 1000 for t in warm])
    upd = summary_ms(dom)
    paint = summary_ms(frame)
    figures = {
        "workloads": count,
        "list_first_load_ms": round(cold, 1),
        "list_load_p50_ms": nav["p50"],
        "list_load_p99_ms": nav["p99"],
        "list_loads": rounds,
        "row_update_p50_ms": upd["p50"],
        "row_update_p99_ms": upd["p99"],
        "row_update_next_frame_p50_ms": paint["p50"],
        "row_update_next_frame_p99_ms": paint["p99"],
        "row_updates": len(dom),
        "js_gzip_kb": round(js_gz, 1),
        "js_raw_kb": round(js_raw, 1),
        "css_gzip_kb": round(css_gz, 1),
        "launch_1000_s": round(launched_s, 2),
    }
    report(
        "dashboard",
        [
            ("workloads in the list", f"{count:,} (launched in {launched_s:.1f} s)"),
            ("list, first load (nothing cached)", f"{cold:.0f} ms (target <= 1,000)"),
            (
                f"list, later loads ({rounds})",
                f"p50 {nav['p50']:.0f} ms, p99 {nav['p99']:.0f} ms (target <= 1,000)",
            ),
            (
                f"publish -> row changed ({len(dom)} at {rate:g}/s)",
                f"p50 {upd['p50']} ms, p99 {upd['p99']} ms (target <= 100)",
            ),
            ("publish -> next frame after it", f"p50 {paint['p50']} ms, p99 {paint['p99']} ms"),
            (
                "bundle: JavaScript gzipped (raw)",
                f"{js_gz:.1f} KB ({js_raw:.1f} KB) (target <= 200)",
            ),
            ("bundle: CSS gzipped", f"{css_gz:.1f} KB"),
        ],
        figures,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--loads", type=int, default=10, help="list loads after the first")
    parser.add_argument("--changes", type=int, default=100, help="row changes to time")
    parser.add_argument("--rate", type=float, default=10.0, help="changes per second")
    args = parser.parse_args()
    missing = (
        "the dashboard is not built: run `make dashboard` (Node 20+)"
        if not (DIST / "index.html").exists()
        else "no /usr/bin/chromium: run scripts/test-deps.sh as root"
        if not CHROMIUM.exists()
        else None
    )
    if missing is not None:
        # `make bench` runs every benchmark: say why this one measured nothing, and go on.
        print(f"dashboard: not measured: {missing}")
        print(json.dumps({"skipped": missing}))
        return
    asyncio.run(measure(args.workloads, args.loads, args.changes, args.rate))


if __name__ == "__main__":
    main()
