"""A leader frozen past its lease (SIGSTOP) and resumed (SIGCONT) changes nothing (issue 35, F1).

Two `einsora scheduler` processes share a region, a store and a bus. The leader is frozen in the
middle of a burst of launches and parks, so it holds intents it fetched and projections it had
not sent; the standby takes over and decides them. Once the old leader resumes, nothing it does
is committed or written: every desired value the bus kept for a machine (a stream sources every
desired write, so none is lost to the bucket's one value per key) has a generation at least the
one before it and, per generation, one content; the new leader keeps its lease and its commits
(no duplicate key in its outbox); every launch is placed once; the store and the bucket agree.

The same on a 3-node cluster, where the desired writes are fenced per key: tests/test_cluster.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from einsora.common.testing import Bus, subprocess_env
from einsora.scheduler.testing import FrozenLeaderCheck

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

LEASE_S = 3.0
MACHINES = 6  # x 8 GPUs: room for every launch, the parked ones still booked


def _scheduler(
    url: str, database_url: str, data_dir: Path, log: Path, key: Path
) -> subprocess.Popen[bytes]:
    env = subprocess_env(
        EINSORA_DATA_DIR=str(data_dir),
        EINSORA_LOG_FORMAT="json",
        EINSORA_SCHEDULER_TOKENS_KEY=str(key),
        EINSORA_SCHEDULER_LEASE_S=str(LEASE_S),
        EINSORA_SIM_MACHINES="true",
    )
    command = [
        str(Path(sys.executable).parent / "einsora"),
        "scheduler",
        "--nats",
        url,
        "--database-url",
        database_url,
        "--ack-wait",
        "2",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)


async def test_a_leader_frozen_past_its_lease_changes_nothing_once_it_resumes(
    bus: Bus, sim: Sim, postgres_url: str, tmp_path: Path
) -> None:
    for i in range(MACHINES):
        await sim.join(f"m-{i}", gpus=8, cpus=128, memory_gib=1024)
    check = FrozenLeaderCheck(bus.nc, bus.js, postgres_url)
    await check.start()
    key = tmp_path / "workload-tokens.key"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    processes = [_scheduler(bus.url, postgres_url, tmp_path / "a", logs[0], key)]
    try:
        await check.until_leader(tmp_path / "a")
        processes.append(_scheduler(bus.url, postgres_url, tmp_path / "b", logs[1], key))
        await check.until_holder_file(tmp_path / "b")
        first = [await sim.launch() for _ in range(24)]
        for w in first:
            await sim.wait_state(w, "scheduled", within_s=30)

        # A burst of parks and launches, and the leader freezes in the middle of it.
        parks = first[:8]
        for w in parks:
            await sim.intent("park", w)
        during = [await sim.launch() for _ in range(8)]
        await sim.until(lambda: any(sim.state(w) for w in during), what="the burst under way")
        os.kill(processes[0].pid, signal.SIGSTOP)
        try:
            await check.until_leader(tmp_path / "b", within_s=30)
            for w in during:
                await sim.wait_state(w, "scheduled", within_s=30)
            for w in parks:
                await sim.wait_state(w, "parking", within_s=30)
            # Launches keep coming as the old leader resumes: whatever it still fetches or
            # decides meets the new leader's decisions.
            after: list[str] = []
            trickle = asyncio.create_task(_trickle(sim, after))
        finally:
            os.kill(processes[0].pid, signal.SIGCONT)
        try:
            await check.until_logged(logs[0], "deposed", within_s=30)
            await sim.until(lambda: len(after) >= 40, within_s=30, what="launches after")
        finally:
            trickle.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trickle
        for w in after:
            await sim.wait_state(w, "scheduled", within_s=30)
        await check.until_leader(tmp_path / "b", within_s=1)

        placed = Counter(w for w in first + during + after for _ in sim.placed_on(w))
        assert all(placed[w] == 1 for w in first + during + after), placed
        for w in parks:
            entry = next(e for _, e in sim.placed_on(w))
            assert entry.target.value == "parked", (w, entry.target)
        await check.verify(expect_machines=MACHINES)
        new_log = logs[1].read_text()
        for bad in ("IntegrityError", "UNIQUE constraint", "duplicate key", "cycle failed"):
            assert bad not in new_log, _lines_with(new_log, bad)
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.terminate()
                process.wait(30)
        await check.stop()


async def _trickle(sim: Sim, into: list[str]) -> None:
    """A launch every 20 ms, a CPU class (the GPUs are all booked by then)."""
    while True:
        into.append(await sim.launch("cpu-2c-4g"))
        await asyncio.sleep(0.02)  # the clients' own pace, not a wait


def _lines_with(log: str, text: str) -> list[object]:
    found: list[object] = []
    for line in log.splitlines():
        if text in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                found.append(line)
    return found[:5]
