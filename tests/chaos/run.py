"""One chaos run, from nothing to its figures: the cell, the workload mix with the faults, the
wait for convergence, the record, the verdict.

Two forms: the short one (`make test-chaos`, `.ci/run`: at least 300 launches and 6 faults, a
few minutes) and the long one (1,000 launches, 12 faults: every kind of fault once), each
seeded: the same seed makes the same mix and the same faults in the same order (what the
processes then do is theirs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from tests.chaos import collect, convergence, faults
from tests.chaos.cell import Cell, Shape
from tests.chaos.clients import Mix, drive, session
from tests.chaos.faults import Exit, Injector
from tests.chaos.model import LEADER_LOSSES, Action, ApiView, Record, Request
from tests.chaos.process import until
from tests.chaos.verdict import Limits, Verdict, judge


@dataclass(frozen=True)
class Form:
    name: str
    launches: int
    faults: int
    clients: int
    duration_s: float
    """Over how long the launches are spread (the faults fit in it)."""
    shape: Shape
    converge_s: float
    """How long the cell may take to converge once the last fault is healed."""


SHORT = Form("short", 300, 6, 4, 75.0, Shape(sim_agents=2, sim_machines=16), 90.0)
LONG = Form("long", 1000, 12, 6, 150.0, Shape(sim_agents=3, sim_machines=16), 90.0)
WARMUP_S = 5.0
log = logging.getLogger("einsora.chaos")


@dataclass
class Outcome:
    form: Form
    seed: int
    record: Record
    verdict: Verdict
    exits: list[Exit]
    converge_s: float | None
    run_s: float
    directory: Path
    figures: dict[str, Any] = field(default_factory=dict)


async def run(form: Form, seed: int, directory: Path, database_url: str) -> Outcome:
    """Build the cell under `directory` on `database_url` (a fresh database), run, judge."""
    began = time.time()
    rng = random.Random(f"{seed}-faults")
    record = Record()
    cell = Cell(directory, database_url, form.shape)
    async with session(30) as http:
        injector = Injector(cell, rng, http)
        supervisor: asyncio.Task[None] | None = None
        try:
            try:
                await cell.start(http)
            except BaseException:
                # The processes' logs go with the cell's directory: CI shows only this.
                for proc in cell.services:
                    log.error(
                        "%s (%s):\n%s", proc.name, "up" if proc.alive else "ended", proc.tail()
                    )
                raise
            started = time.time()
            log.info("cell up in %.1f s: %d machines", started - began, len(cell.machine_ids()))
            supervisor = asyncio.create_task(injector.supervise())
            kinds = faults.plan(rng, form.faults)
            gap = max(2.0, (form.duration_s - WARMUP_S) / form.faults - 8.0)
            mix = Mix(form.launches, form.clients, form.duration_s)
            await asyncio.gather(
                drive(cell.api_url, cell.owner_token, mix, seed, record.requests),
                injector.run(kinds, warmup_s=WARMUP_S, gap_s=gap),
            )
            quiet = time.time()
            log.info("workload and faults done in %.1f s; converging", quiet - started)
            converge_s = await _converge(cell, http, record.requests, form.converge_s)
            log.info("converged: %s", "no" if converge_s is None else f"{converge_s - quiet:.1f} s")
            record.faults = injector.faults
            await _collect(cell, http, record, since=started)
        finally:
            if supervisor is not None:
                supervisor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await supervisor
            await cell.stop()
    collect.save(record, directory / "record.json")
    verdict = judge(record, Limits())
    outcome = Outcome(
        form,
        seed,
        record,
        verdict,
        injector.exits,
        None if converge_s is None else converge_s - quiet,
        time.time() - began,
        directory,
    )
    outcome.figures = figures(outcome)
    return outcome


async def _api_view(cell: Cell, http: aiohttp.ClientSession) -> dict[str, ApiView] | None:
    """Every workload as the api answers now; None when it does not answer."""
    view: dict[str, ApiView] = {}
    cursor: str | None = None
    headers = {"Authorization": f"Bearer {cell.owner_token}"}
    try:
        while True:
            params = {"limit": "200", **({"cursor": cursor} if cursor else {})}
            async with http.get(
                f"{cell.api_url}/v1/workloads", params=params, headers=headers
            ) as resp:
                if resp.status != 200:
                    return None
                page = await resp.json()
            for w in page["items"]:
                placement = w.get("placement") or {}
                view[w["id"]] = ApiView(w["state"], placement.get("machine"))
            cursor = page.get("next_cursor")
            if not cursor:
                return view
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _converge(
    cell: Cell, http: aiohttp.ClientSession, requests: list[Request], within_s: float
) -> float | None:
    """Wait until every acknowledged request's workload is where it may end, as the api says
    (bounded); when it got there, or None."""
    wishes = convergence.asked(requests)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        view = await _api_view(cell, http)
        if view is not None and all(
            w in view and view[w].state in wish.expected for w, wish in wishes.items()
        ):
            return time.time()
        await asyncio.sleep(2.0)
    return None


async def _collect(
    cell: Cell, http: aiohttp.ClientSession, record: Record, *, since: float
) -> None:
    assert cell.nc is not None
    js = cell.nc.jetstream(timeout=30)
    collect.read_events(await collect.read_stream(js, "EVENTS"), record)
    with contextlib.suppress(AssertionError):  # if not, I2 and I5 say what it lacks
        await until(
            lambda: collect.accounting_caught_up(cell.database_url, record.events),
            30.0,
            "accounting applied every event",
        )
    await collect.mirror_caught_up(js)
    collect.read_machines(await collect.read_stream(js, collect.MIRROR), record)
    record.accounted = await collect.read_accounting(cell.database_url)
    record.usage_now = time.time()
    workloads = sorted({e.workload for e in record.events})
    record.usage = await collect.read_usage(cell.nc, workloads, since, record.usage_now)
    record.api = await _api_view(cell, http) or {}
    record.ended = time.time()


def figures(outcome: Outcome) -> dict[str, Any]:
    """The run's figures: what the closing JSON line says."""
    record, verdict = outcome.record, outcome.verdict
    launches = {r.workload for r in record.requests if r.action is Action.create and r.acknowledged}
    taken = [t.seconds for t in verdict.takeovers if t.seconds is not None]
    return {
        "form": outcome.form.name,
        "seed": outcome.seed,
        "machines": outcome.form.shape.machines,
        "launches": len(launches),
        "requests": len(record.requests),
        "acknowledged": sum(1 for r in record.requests if r.acknowledged),
        "unanswered": sum(1 for r in record.requests if r.unanswered),
        "faults": len(record.faults),
        "fault_kinds": [f.kind.value for f in record.faults],
        "leader_losses": sum(1 for f in record.faults if f.kind in LEADER_LOSSES),
        "takeover_s": [
            None if t.seconds is None else round(t.seconds, 2) for t in verdict.takeovers
        ],
        "takeover_s_max": round(max(taken), 2) if taken else None,
        "converge_s": None if outcome.converge_s is None else round(outcome.converge_s, 1),
        "violations": verdict.by_invariant,
        "violations_total": len(verdict.violations),
        "unexpected_exits": [e.name for e in outcome.exits],
        "workloads_checked": len(convergence.asked(record.requests)),
        "allocations": len(record.accounted),
        "desired_values": len(record.desired),
        "events": len(record.events),
        "mirror_gaps": record.mirror_gaps,
        "run_s": round(outcome.run_s, 1),
        "passed": verdict.passed,
    }
