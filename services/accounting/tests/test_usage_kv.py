"""Each tenant's usage in KV `usage/tenant.<id>`: GPU-hours of the last week, decayed usage (the
exact integral of 2^(-age/H), checked against the closed form and a numeric integral), and the
GPUs held now; republished on change and on a period."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from einsora.accounting.decay import decay, decayed_gpu_hours
from einsora.accounting.testing import T0, SchedulerPlayer, events_done, held, hours
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import TenantUsage, WorkloadState
from einsora.common.testing import Bus

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting

Interval = tuple[int, datetime, datetime]


def closed_form(intervals: list[Interval], now: datetime, half_life_h: float) -> float:
    """Σ g · H/ln 2 · (2^(-(now-b)/H) - 2^(-(now-a)/H)), times in hours."""
    total = 0.0
    for gpus, a, b in intervals:
        age_a = (now - a).total_seconds() / 3600
        age_b = (now - b).total_seconds() / 3600
        total += (
            gpus
            * half_life_h
            / math.log(2)
            * (2 ** (-age_b / half_life_h) - 2 ** (-age_a / half_life_h))
        )
    return total


def numeric(
    intervals: list[Interval], now: datetime, half_life_h: float, steps: int = 4000
) -> float:
    """The same integral by Simpson's rule: a check of the closed form itself."""
    total = 0.0
    for gpus, a, b in intervals:
        lo = -(now - a).total_seconds() / 3600
        hi = -(now - b).total_seconds() / 3600
        width = (hi - lo) / steps

        def weight(t: float) -> float:
            return float(2 ** (t / half_life_h))

        inner = sum((4 if k % 2 else 2) * weight(lo + k * width) for k in range(1, steps))
        total += gpus * width / 3 * (weight(lo) + inner + weight(hi))
    return total


async def published(
    kv: KeyValue, tenant_id: str, check: Callable[[TenantUsage], bool], within_s: float = 15.0
) -> TenantUsage:
    """The tenant's KV value once `check` holds for it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    last: TenantUsage | None = None
    while True:
        try:
            entry = await kv.get(names.tenant_usage_key(tenant_id))
            if entry.value:
                last = TenantUsage.from_bytes(entry.value)
                if check(last):
                    return last
        except KeyNotFoundError:
            pass
        if loop.time() > deadline:
            raise AssertionError(f"usage of {tenant_id} not as expected; last: {last}")
        await asyncio.sleep(0.02)


def near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def test_the_decay_integral_is_exact() -> None:
    intervals = [(2, T0 - hours(30), T0 - hours(6)), (1, T0 - hours(2), T0)]
    for half_life in (0.5, 6.0, 24.0, 24 * 14.0):
        got = sum(decayed_gpu_hours(g, a, b, T0, half_life) for g, a, b in intervals)
        assert near(got, closed_form(intervals, T0, half_life))
        assert abs(got - numeric(intervals, T0, half_life)) < 1e-7 * got
        # A figure kept at one instant and decayed on equals the figure worked out later.
        later = T0 + hours(17)
        kept = decay(got, T0, later, half_life)
        assert near(
            kept, sum(decayed_gpu_hours(g, a, b, later, half_life) for g, a, b in intervals)
        )
    # Holding one GPU for ever tends to H / ln 2 GPU-hours; an empty interval counts nothing.
    forever = decayed_gpu_hours(1, T0 - timedelta(days=3650), T0, T0, 24.0)
    assert near(forever, 24 / math.log(2))
    assert decayed_gpu_hours(3, T0, T0, T0, 24.0) == 0.0


async def test_usage_in_kv_is_the_week_the_decayed_integral_and_what_is_held(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    half_life = 6.0
    await start_accounting(
        store_url,
        settings={"fair_share_half_life_h": half_life},
        clock=lambda: T0,
        publish_period_s=3600,
    )
    kv = await bus.js.key_value(names.USAGE_KV.name)
    a, b, c = (new_id("workload") for _ in range(3))
    await scheduler.run_for(
        c, T0 - timedelta(days=10), T0 - timedelta(days=8), tenant_id="t-k", metered=held(4)
    )
    await scheduler.run_for(a, T0 - hours(30), T0 - hours(6), tenant_id="t-k", metered=held(2))
    await scheduler.run_for(
        b, T0 - hours(2), None, tenant_id="t-k", metered=held(1, placed_class="a100-80gb")
    )
    intervals = [
        (4, T0 - timedelta(days=10), T0 - timedelta(days=8)),
        (2, T0 - hours(30), T0 - hours(6)),
        (1, T0 - hours(2), T0),
    ]
    want = closed_form(intervals, T0, half_life)
    usage = await published(kv, "t-k", lambda u: u.open_gpus == {"a100-80gb": 1})
    assert usage.tenant_id == "t-k"
    assert usage.at == T0
    assert usage.half_life_h == half_life
    assert near(usage.gpu_hours_7d, 2 * 24 + 1 * 2)  # the 4 GPUs of ten days ago are out
    assert near(usage.decayed_gpu_hours, want)
    assert abs(usage.decayed_gpu_hours - numeric(intervals, T0, half_life)) < 1e-7 * want

    # b stops an hour ago: published on the change, not on the (hour-long) period.
    await scheduler.transition(b, WorkloadState.parking, T0 - hours(1), tenant_id="t-k")
    intervals[2] = (1, T0 - hours(2), T0 - hours(1))
    closed = await published(kv, "t-k", lambda u: u.open_gpus == {})
    assert near(closed.gpu_hours_7d, 2 * 24 + 1 * 1)
    assert near(closed.decayed_gpu_hours, closed_form(intervals, T0, half_life))


async def test_a_new_half_life_recomputes_decayed_usage_from_the_allocations(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    first = await start_accounting(store_url, clock=lambda: T0)
    w = new_id("workload")
    await scheduler.run_for(w, T0 - hours(50), T0 - hours(20), tenant_id="t-h", metered=held(3))
    await events_done(bus.js)
    kv = await bus.js.key_value(names.USAGE_KV.name)
    intervals = [(3, T0 - hours(50), T0 - hours(20))]
    await published(
        kv, "t-h", lambda u: near(u.decayed_gpu_hours, closed_form(intervals, T0, 24.0))
    )
    await first.stop()

    await start_accounting(store_url, settings={"fair_share_half_life_h": 2.0}, clock=lambda: T0)
    usage = await published(kv, "t-h", lambda u: u.half_life_h == 2.0)
    assert near(usage.decayed_gpu_hours, closed_form(intervals, T0, 2.0))


async def test_usage_is_republished_on_a_period_as_time_passes(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    now = [T0]
    await start_accounting(sqlite_url, clock=lambda: now[0], publish_period_s=0.1)
    kv = await bus.js.key_value(names.USAGE_KV.name)
    w = new_id("workload")
    await scheduler.run_for(w, T0 - hours(1), None, tenant_id="t-p", metered=held(2))
    await published(kv, "t-p", lambda u: near(u.gpu_hours_7d, 2.0))
    # No event at all: the open allocation grows, and its decayed figure with it.
    now[0] = T0 + hours(3)
    later = await published(kv, "t-p", lambda u: u.at == T0 + hours(3))
    assert near(later.gpu_hours_7d, 8.0)
    assert near(later.decayed_gpu_hours, closed_form([(2, T0 - hours(1), now[0])], now[0], 24.0))
