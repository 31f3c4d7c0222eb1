"""`einsora accounting` killed with SIGKILL mid-stream, again and again, then left to finish:
no interval lost, none counted twice, in the allocations, the day sums and decayed usage."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from einsora.accounting.decay import decayed_gpu_hours
from einsora.accounting.service import EVENTS_CONSUMER
from einsora.accounting.store import AccountingStore
from einsora.accounting.testing import T0, SchedulerPlayer, ask_report, events_done, held, hours
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import ReportGroup, UsageReportRequest
from einsora.common.testing import Bus, subprocess_env

WORKLOADS = 400
NOW = T0 + hours(WORKLOADS)


async def test_sigkill_mid_stream_loses_and_repeats_no_interval(
    bus: Bus, scheduler: SchedulerPlayer, store_url: str, tmp_path: Path
) -> None:
    command = [
        sys.executable,
        "-m",
        "einsora.accounting",
        "--nats",
        bus.url,
        "--database-url",
        store_url,
        "--data-dir",
        str(tmp_path / "data"),
        "--batch",
        "16",
        "--ack-wait",
        "2",
        "--log-format",
        "text",
    ]
    log_file = (tmp_path / "accounting.log").open("ab")

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, stdout=log_file, stderr=log_file, env=subprocess_env())

    workloads = [new_id("workload") for _ in range(WORKLOADS)]
    tenants = {w: f"t-{i % 7}" for i, w in enumerate(workloads)}
    gpus = {w: 1 + i % 4 for i, w in enumerate(workloads)}

    async def play() -> None:
        # Paced, as a scheduler publishes; the kills land mid-stream (checked at each).
        for i, w in enumerate(workloads):
            start = T0 + hours(i) + hours(0.25)
            await scheduler.run_for(
                w, start, start + hours(i % 30 + 0.5), tenant_id=tenants[w], metered=held(gpus[w])
            )
            if i % 10 == 9:
                await asyncio.sleep(0.02)

    store = AccountingStore(store_url)
    proc = spawn()
    publishing = asyncio.create_task(play())
    try:
        for threshold in (60, 200):
            await _until_closed(store, threshold, proc)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            info = await bus.js.consumer_info(names.EVENTS.name, EVENTS_CONSUMER)
            assert info.num_pending + info.num_ack_pending > 0, "killed after the stream's end"
            proc = spawn()
        await publishing
        await _until_consuming(bus)
        await events_done(bus.js, within_s=60)

        allocations = await store.allocations()
        assert sorted(a.workload_id for a in allocations) == sorted(workloads)
        for a in allocations:
            i = workloads.index(a.workload_id)
            assert a.started_at == T0 + hours(i) + hours(0.25)
            assert a.ended_at == a.started_at + hours(i % 30 + 0.5)
        # The day sums and the decayed figures took each close exactly once too.
        reply = await ask_report(
            bus.nc,
            UsageReportRequest.model_validate(
                {
                    "group_by": ReportGroup.tenant,
                    "from": T0 - hours(48),
                    "to": NOW + hours(48),
                    "now": NOW,
                }
            ),
        )
        assert reply.error is None
        for item in reply.items:
            own = [a for a in allocations if a.tenant_id == item.group]
            assert (
                abs(item.gpu_hours * 3600 - sum(a.gpu_count * a.seconds(NOW) for a in own)) < 1e-3
            )
        usage = await store.tenant_usage(sorted(set(tenants.values())), NOW + hours(100), 24.0)
        for u in usage:
            want = sum(
                decayed_gpu_hours(
                    a.gpu_count, a.started_at, a.ended_at or NOW, NOW + hours(100), 24.0
                )
                for a in allocations
                if a.tenant_id == u.tenant_id
            )
            assert abs(u.decayed_gpu_hours - want) < 1e-9 * max(1.0, want)
    finally:
        publishing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publishing
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()
        await store.close()


async def _until_closed(store: AccountingStore, count: int, proc: subprocess.Popen[bytes]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        try:
            closed = sum(1 for a in await store.allocations() if not a.is_open)
        except Exception:  # the tables are not made yet
            closed = 0
        if closed >= count:
            return
        assert proc.poll() is None, "accounting exited; see accounting.log"
        assert loop.time() < deadline, f"only {closed} allocations closed"
        await asyncio.sleep(0.01)


async def _until_consuming(bus: Bus) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        with contextlib.suppress(Exception):
            await bus.js.consumer_info(names.EVENTS.name, EVENTS_CONSUMER)
            return
        assert loop.time() < deadline, "accounting did not start consuming"
        await asyncio.sleep(0.05)


pytestmark = pytest.mark.slow
