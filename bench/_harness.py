"""What every benchmark shares: percentiles, the table, the closing JSON line, saved results.

Each benchmark prints a readable table, then as its last line one JSON object of its figures with
units in the names. The same object is saved under `.data/bench/<name>.json`, so a later
benchmark can print its figures beside another's (the bus floor, say) without re-measuring.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent.parent / ".data" / "bench"


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0–100) by nearest rank."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary_ms(samples_s: list[float]) -> dict[str, float]:
    """p50, p99 and mean of samples in seconds, in milliseconds."""
    return {
        "p50": round(percentile(samples_s, 50) * 1000, 3),
        "p99": round(percentile(samples_s, 99) * 1000, 3),
        "mean": round(statistics.fmean(samples_s) * 1000, 3),
    }


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def report(name: str, rows: list[tuple[str, str]], figures: dict[str, Any]) -> None:
    """Print the table and the JSON line, and save the figures for other benchmarks."""
    width = max(len(r[0]) for r in rows)
    print(f"{name} on {machine()}")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(figures))
    print(json.dumps(figures))


def load(name: str) -> dict[str, Any] | None:
    """Figures another benchmark saved, or None if it has not run on this checkout."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


DEFAULT_POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"


@contextlib.asynccontextmanager
async def fresh_postgres(server_url: str = DEFAULT_POSTGRES) -> AsyncIterator[str]:
    """A new, empty Postgres database on `server_url`'s server for one run, dropped after."""
    import asyncpg
    from sqlalchemy.engine import make_url

    admin_dsn = make_url(server_url).set(drivername="postgresql").render_as_string(False)
    name = f"einsora_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
