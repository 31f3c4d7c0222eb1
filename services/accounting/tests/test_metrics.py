"""Accounting's /metrics: allocations open, GPU-seconds metered by tenant and class, events
metered; on its own loopback port."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from einsora.accounting.testing import T0, SchedulerPlayer, events_done, held, hours
from einsora.common.ids import new_id
from einsora.common.schemas import WorkloadState
from einsora.common.testing import Bus

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_count_allocations_gpu_seconds_and_events(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url, settings={"accounting_metrics_port": 0})
    port = accounting.metrics_port
    assert port is not None
    a, b = new_id("workload"), new_id("workload")
    await scheduler.run_for(a, T0, T0 + hours(2), tenant_id="t-m", metered=held(3))
    await scheduler.run_for(b, T0, None, tenant_id="t-m", metered=held(1, placed_class="a100-80gb"))
    await scheduler.transition(b, WorkloadState.running, T0, tenant_id="t-m", metered=held(1))
    await events_done(bus.js)

    samples = await scrape(port)
    assert samples[("einsora_allocations_open", ())] == 1
    assert (
        samples[("einsora_gpu_seconds_metered_total", (("class", "l40s-48gb"), ("tenant", "t-m")))]
        == 3 * 2 * 3600
    )
    assert (
        "einsora_gpu_seconds_metered_total",
        (("class", "a100-80gb"), ("tenant", "t-m")),
    ) not in samples
    assert (
        samples[("einsora_events_metered_total", ())] == 3
    )  # the repeated running metered nothing

    await scheduler.transition(b, WorkloadState.removing, T0 + hours(1), tenant_id="t-m")
    await events_done(bus.js)
    samples = await scrape(port)
    assert samples[("einsora_allocations_open", ())] == 0
    assert (
        samples[("einsora_gpu_seconds_metered_total", (("class", "a100-80gb"), ("tenant", "t-m")))]
        == 3600
    )
    assert samples[("einsora_events_metered_total", ())] == 4


async def test_a_restart_counts_the_open_allocations_it_finds(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    first = await start_accounting(sqlite_url)
    for _ in range(3):
        await scheduler.run_for(new_id("workload"), T0, None, metered=held(1))
    await events_done(bus.js)
    await first.stop()
    again = await start_accounting(sqlite_url, settings={"accounting_metrics_port": 0})
    assert again.metrics_port is not None
    samples = await scrape(again.metrics_port)
    assert samples[("einsora_allocations_open", ())] == 3
