"""Schedulers that start on one SQLite file at the same moment all migrate it.

Two regions' schedulers may share a file (a small Lab), and a standby starts beside its leader
(ADR-0021): each must wait its turn at the migration rather than fail with "database is
locked", which a plain BEGIN gave one of them whenever two migrated at the same instant (each
reads, then asks to write, and SQLite refuses the second writer at once instead of letting it
wait).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

_MIGRATE = """
import asyncio, sys, time
from pathlib import Path
from einsora.scheduler.store import SchedulerStore

async def main() -> None:
    store = SchedulerStore(sys.argv[1])
    here = Path(sys.argv[2])
    (here / f"ready-{sys.argv[3]}").touch()
    while not (here / "go").exists():  # every process starts its migration at once
        time.sleep(0.001)
    await store.migrate()
    await store.close()

asyncio.run(main())
"""

PROCESSES = 3


def _migrate_at_once(tmp: Path, url: str) -> list[tuple[int, str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATE, url, str(tmp), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(PROCESSES)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp.glob("ready-*"))) < PROCESSES:
        assert time.monotonic() < deadline, "the migrating processes did not start"
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
        time.sleep(0.01)
    (tmp / "go").touch()
    outputs = [p.communicate(timeout=60)[0].decode() for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]


def test_schedulers_migrating_one_sqlite_file_at_once_all_succeed(tmp_path: Path) -> None:
    for round_ in range(3):
        here = tmp_path / f"round-{round_}"
        here.mkdir()
        for code, output in _migrate_at_once(here, f"sqlite+aiosqlite:///{here}/shared.db"):
            assert code == 0, output[-2000:]
