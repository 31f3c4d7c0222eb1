"""Usage reports over `accounting.report`: each group's sums equal the sums of the allocations
and token counts behind it, to the second, whatever the range and the grouping."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from einsora.accounting.model import Allocation
from einsora.accounting.service import TOKENS_CONSUMER
from einsora.accounting.testing import (
    T0,
    GatewayPlayer,
    SchedulerPlayer,
    ask_report,
    events_done,
    held,
    hours,
    tokens_done,
)
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import (
    MAX_REPORT_ITEMS,
    CountSource,
    ReportGroup,
    TokenUsage,
    UsageReportReply,
    UsageReportRequest,
    WorkloadState,
)
from einsora.common.testing import Bus

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting

NOW = T0 + hours(6)
"""The report's `now`: open allocations count up to here."""
MIDNIGHT = datetime(T0.year, T0.month, T0.day, tzinfo=UTC)
TENANTS = ("t-a", "t-b", "t-c")
KEYS = ("gk-1", "gk-2", "gk-3")
ENDPOINTS = ("w-ep-1", "w-ep-1-r1", "w-ep-2", "w-ep-3")
"""The replicas that served the tokens (an endpoint's own id, or one of its replicas')."""
SOURCES = tuple(CountSource)

Totals = dict[str, list[float]]


def request(group_by: ReportGroup, start: datetime, end: datetime, **filters: object) -> bytes:
    return UsageReportRequest.model_validate(
        {"group_by": group_by, "from": start, "to": end, "now": NOW, **filters}
    ).to_bytes()


def expected(
    allocations: list[Allocation],
    tokens: list[TokenUsage],
    group_by: ReportGroup,
    start: datetime,
    end: datetime,
    *,
    tenant_ids: list[str] | None = None,
    workload_ids: list[str] | None = None,
    key_ids: list[str] | None = None,
    endpoint_ids: list[str] | None = None,
) -> Totals:
    """The report worked out by hand: second by second of overlap, midnight by midnight."""
    totals: Totals = defaultdict(lambda: [0.0, 0.0, 0, 0])
    if group_by not in (ReportGroup.key, ReportGroup.key_source, ReportGroup.endpoint):
        for a in allocations:
            if tenant_ids is not None and a.tenant_id not in tenant_ids:
                continue
            if workload_ids is not None and a.workload_id not in workload_ids:
                continue
            lo = max(a.started_at, start)
            hi = min(a.ended_at if a.ended_at is not None else NOW, end)
            while lo < hi:
                midnight = datetime(lo.year, lo.month, lo.day, tzinfo=UTC) + timedelta(days=1)
                piece = min(hi, midnight)
                group = {
                    ReportGroup.tenant: a.tenant_id,
                    ReportGroup.workload: a.workload_id,
                    ReportGroup.klass: a.placed_class,
                    ReportGroup.region: a.region,
                    ReportGroup.day: lo.date().isoformat(),
                }[group_by]
                seconds = (piece - lo).total_seconds()
                totals[group][0] += a.gpu_count * seconds
                totals[group][1] += a.cpus * seconds
                lo = piece
    if group_by in (
        ReportGroup.tenant,
        ReportGroup.key,
        ReportGroup.key_source,
        ReportGroup.endpoint,
        ReportGroup.day,
    ):
        for u in tokens:
            if not start <= u.at < end:
                continue
            if tenant_ids is not None and u.tenant_id not in tenant_ids:
                continue
            if key_ids is not None and u.key_id not in key_ids:
                continue
            if endpoint_ids is not None and u.endpoint not in endpoint_ids:
                continue
            group = {
                ReportGroup.tenant: u.tenant_id,
                ReportGroup.key: u.key_id,
                ReportGroup.key_source: f"{u.key_id}/{u.source.value}",
                ReportGroup.endpoint: u.endpoint,
                ReportGroup.day: u.at.date().isoformat(),
            }[group_by]
            totals[group][2] += u.prompt_tokens
            totals[group][3] += u.completion_tokens
    return dict(totals)


def assert_matches(reply: UsageReportReply, totals: Totals) -> None:
    assert reply.error is None
    assert not reply.truncated
    got = {i.group: i for i in reply.items}
    assert sorted(got) == sorted(totals)
    assert [i.group for i in reply.items] == sorted(totals)
    for group, (gpu_s, cpu_s, prompt, completion) in totals.items():
        item = got[group]
        # To the second (far closer in fact: float rounding only).
        assert abs(item.gpu_hours * 3600 - gpu_s) < 1e-3, group
        assert abs(item.cpu_core_hours * 3600 - cpu_s) < 1e-3, group
        assert (item.prompt_tokens, item.completion_tokens) == (prompt, completion), group


async def history(
    scheduler: SchedulerPlayer, gateway: GatewayPlayer
) -> tuple[list[str], list[TokenUsage]]:
    """Forty workloads over a week, some across midnights, some still open, some resumed; and
    token counts, some on the hour, served by four replicas, counted from every source."""
    rng = random.Random(13)
    workloads = []
    for i in range(40):
        w = new_id("workload")
        workloads.append(w)
        tenant = TENANTS[i % 3]
        what = held(
            rng.randint(1, 4),
            machine=f"m-{i % 5}",
            placed_class=("l40s-48gb", "a100-80gb")[i % 2],
            region=("local", "east")[i % 4 // 2],
            cpus=rng.choice([0.5, 4.0, 16.0]),
        )
        start = T0 - timedelta(seconds=rng.uniform(0, 7 * 86400))
        length = timedelta(seconds=rng.uniform(60, 3 * 86400))
        end = None if i % 8 == 0 else start + length
        if end is not None and end > NOW:
            end = NOW - timedelta(seconds=rng.uniform(1, 3600))
        await scheduler.run_for(w, start, end, tenant_id=tenant, metered=what)
        if i % 7 == 0 and end is not None:
            # Resumed later, and stopped again: a second allocation.
            again = end + hours(rng.uniform(0.1, 3))
            await scheduler.run_for(
                w,
                min(again, NOW - hours(0.05)),
                min(again + hours(2), NOW),
                tenant_id=tenant,
                metered=what,
                until_state=WorkloadState.removing,
            )
    tokens = []
    for i in range(60):
        at = T0 - timedelta(seconds=rng.uniform(0, 7 * 86400))
        if i % 10 == 0:
            at = MIDNIGHT - hours(i // 10)  # exactly on the hour (and on midnight)
        usage = gateway.usage(
            at,
            tenant_id=TENANTS[i % 2],
            key_id=KEYS[i % 3],
            prompt=rng.randint(0, 500),
            completion=rng.randint(0, 500),
            endpoint=ENDPOINTS[i % 4],
            source=SOURCES[i // 2 % 3],
        )
        tokens.append(usage)
        await gateway.send(usage)
    return workloads, tokens


RANGES = {
    "whole days": (MIDNIGHT - timedelta(days=6), MIDNIGHT + timedelta(days=1)),
    "partial days at both ends": (T0 - timedelta(days=3, hours=7, minutes=13), T0 + hours(5)),
    "inside one day": (T0 - hours(5), T0 - hours(0.5)),
    "inside one hour": (MIDNIGHT + timedelta(minutes=7), MIDNIGHT + timedelta(minutes=51)),
    "reaching past now": (T0 - timedelta(days=2), T0 + timedelta(days=10)),
    "all of it": (T0 - timedelta(days=30), T0 + timedelta(days=30)),
}


async def test_report_sums_equal_the_allocations_sums_for_every_grouping(
    bus: Bus,
    scheduler: SchedulerPlayer,
    gateway: GatewayPlayer,
    start_accounting: StartAccounting,
    store_url: str,
) -> None:
    accounting = await start_accounting(store_url)
    _, tokens = await history(scheduler, gateway)
    await events_done(bus.js)
    await tokens_done(bus.js)
    allocations = await accounting.store.allocations()
    assert len(allocations) > 40
    assert any(a.is_open for a in allocations)
    crossing = [a for a in allocations if a.ended_at and a.ended_at.date() != a.started_at.date()]
    assert crossing, "the history should cross midnights"
    for name, (start, end) in RANGES.items():
        for group_by in ReportGroup:
            reply = await ask_report(bus.nc, request(group_by, start, end))
            try:
                assert_matches(reply, expected(allocations, tokens, group_by, start, end))
            except AssertionError as exc:
                raise AssertionError(f"{name}, by {group_by.value}: {exc}") from exc

    # A tenant's report is the sum of its allocations, to the second.
    start, end = RANGES["all of it"]
    by_tenant = await ask_report(bus.nc, request(ReportGroup.tenant, start, end))
    for item in by_tenant.items:
        own = [a for a in allocations if a.tenant_id == item.group]
        assert abs(item.gpu_hours * 3600 - sum(a.gpu_count * a.seconds(NOW) for a in own)) < 1e-3


async def test_filters_narrow_allocations_and_tokens_separately(
    bus: Bus,
    scheduler: SchedulerPlayer,
    gateway: GatewayPlayer,
    start_accounting: StartAccounting,
    store_url: str,
) -> None:
    accounting = await start_accounting(store_url)
    workloads, tokens = await history(scheduler, gateway)
    await events_done(bus.js)
    await tokens_done(bus.js)
    allocations = await accounting.store.allocations()
    start, end = RANGES["partial days at both ends"]
    cases: list[dict[str, list[str] | None]] = [
        {"tenant_ids": ["t-a"]},
        {"tenant_ids": ["t-b", "t-c"], "key_ids": ["gk-2"]},
        {"tenant_ids": ["t-a"], "workload_ids": workloads[:12], "key_ids": ["gk-1", "gk-3"]},
        {"workload_ids": [], "key_ids": []},
        {"tenant_ids": []},
        {"endpoint_ids": ["w-ep-1", "w-ep-1-r1"]},
        {"tenant_ids": ["t-a"], "key_ids": ["gk-1", "gk-2"], "endpoint_ids": ["w-ep-2"]},
        {"endpoint_ids": []},
    ]
    for filters in cases:
        for group_by in ReportGroup:
            reply = await ask_report(bus.nc, request(group_by, start, end, **filters))
            want = expected(allocations, tokens, group_by, start, end, **filters)
            if group_by is ReportGroup.key_source and filters.get("endpoint_ids"):
                assert want, "the history should have tokens served by these endpoints"
            try:
                assert_matches(reply, want)
            except AssertionError as exc:
                raise AssertionError(f"{filters}, by {group_by.value}: {exc}") from exc


async def test_token_counts_accumulate_and_a_redelivered_count_adds_nothing(
    bus: Bus, gateway: GatewayPlayer, start_accounting: StartAccounting, store_url: str
) -> None:
    accounting = await start_accounting(store_url)
    first = gateway.usage(T0, key_id="gk-9", prompt=100, completion=40)
    second = gateway.usage(T0 + hours(1), key_id="gk-9", prompt=7, completion=3)
    for usage in (first, second):
        await gateway.send(usage)
        await gateway.send(usage, msg_id=new_id("request"))  # the same request, republished
    await tokens_done(bus.js)
    window = (T0 - hours(1), T0 + hours(3))
    reply = await ask_report(bus.nc, request(ReportGroup.key, *window))
    assert [(i.group, i.prompt_tokens, i.completion_tokens) for i in reply.items] == [
        ("gk-9", 107, 43)
    ]

    # Replayed from the stream's start after a restart: still counted once.
    await accounting.stop()
    await bus.js.delete_consumer(names.USAGE.name, TOKENS_CONSUMER)
    await start_accounting(store_url)
    await tokens_done(bus.js)
    again = await ask_report(bus.nc, request(ReportGroup.tenant, *window))
    assert [(i.group, i.prompt_tokens, i.completion_tokens) for i in again.items] == [
        ("t-a", 107, 43)
    ]
    assert again.items[0].gpu_hours == 0


async def test_a_report_with_more_groups_than_allowed_is_truncated(
    bus: Bus, gateway: GatewayPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url)
    usages = [gateway.usage(T0, key_id=f"gk-{i:05d}") for i in range(MAX_REPORT_ITEMS + 1)]
    await accounting.store.add_token_usage(usages)
    reply = await ask_report(bus.nc, request(ReportGroup.key, T0 - hours(1), T0 + hours(1)))
    assert reply.truncated
    # As many as the limit allows, and as fit in one message on the bus (1 MB), in order.
    assert 0 < len(reply.items) <= MAX_REPORT_ITEMS
    assert [i.group for i in reply.items] == [f"gk-{i:05d}" for i in range(len(reply.items))]
    assert all((i.prompt_tokens, i.completion_tokens) == (10, 5) for i in reply.items)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (
            {"group_by": "tenant", "from": "2030-01-02T00:00:00Z", "to": "2030-01-01T00:00:00Z"},
            "`from` must be before `to`",
        ),
        (
            {"group_by": "tenant", "from": "2030-01-01T00:00:00", "to": "2030-01-02T00:00:00Z"},
            "`from` must carry a time zone",
        ),
        (
            {"group_by": "user", "from": "2030-01-01T00:00:00Z", "to": "2030-01-02T00:00:00Z"},
            "group_by",
        ),
        (
            {"group_by": "day", "from": "2000-01-01T00:00:00Z", "to": "2030-01-02T00:00:00Z"},
            "at most 3660 days",
        ),
        (
            {
                "group_by": "tenant",
                "from": "2030-01-01T00:00:00Z",
                "to": "2030-01-02T00:00:00Z",
                "tenant_ids": [f"t-{i}" for i in range(10_001)],
            },
            "`tenant_ids` may list at most 10,000 ids",
        ),
        ({"from": "2030-01-01T00:00:00Z"}, "not a usage report request"),
    ],
)
async def test_a_bad_request_is_answered_with_what_is_wrong(
    bus: Bus,
    start_accounting: StartAccounting,
    sqlite_url: str,
    payload: dict[str, object],
    problem: str,
) -> None:
    await start_accounting(sqlite_url)
    reply = await ask_report(bus.nc, json.dumps(payload).encode())
    assert reply.items == []
    assert reply.error is not None
    assert problem in reply.error


async def test_garbage_is_answered_too(
    bus: Bus, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    await start_accounting(sqlite_url)
    reply = await ask_report(bus.nc, b"\xff not json")
    assert reply.error is not None
    assert reply.error.startswith("not a usage report request")
