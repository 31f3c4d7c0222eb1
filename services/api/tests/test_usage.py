"""Usage reports: who sees what (a member their own share, an admin the tenant, the operator every
tenant), `group_by=user` folded from workloads and keys, `group_by=endpoint` from workloads and
serving replicas, CSV that parses and matches the JSON,
bad parameters refused naming the field, and a 503 that says so when accounting is not there.

The reports come from the real accounting service, fed real workload events and token counts
on the bus."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from einsora.accounting.service import AccountingService
from einsora.accounting.testing import (
    GatewayPlayer,
    SchedulerPlayer,
    events_done,
    held,
    tokens_done,
)
from einsora.api.routers.usage import wants_csv
from einsora.api.schemas.usage import CSV_COLUMNS, UsageGroupBy, UsageItemOut, UsageReportOut
from einsora.api.services.usage import as_csv
from einsora.api.testing import Client, RunningApi, new_member, new_tenant
from einsora.common.settings import Settings
from einsora.common.testing import Bus


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"group_by": "key"}, "group_by"),
        ({"group_by": "everything"}, "group_by"),
        ({"from": "last tuesday"}, "from"),
        ({"to": "2026-02-30T00:00:00Z"}, "to"),
        ({"from": "2026-05-02T00:00:00Z", "to": "2026-05-01T00:00:00Z"}, "from"),
        ({"from": "2026-05-01T00:00:00Z", "to": "2026-05-01T00:00:00Z"}, "from"),
        ({"from": "2025-01-01T00:00:00Z", "to": "2026-05-01T00:00:00Z"}, "from"),
        ({"to": "0001-01-02T00:00:00Z"}, "to"),
        ({"tenant": "t" * 65}, "tenant"),
    ],
    ids=[
        "key-is-not-offered",
        "unknown-group",
        "not-a-time",
        "no-such-day",
        "from-after-to",
        "empty-window",
        "over-400-days",
        "before-time-began",
        "tenant-too-long",
    ],
)
async def test_bad_parameters_are_refused_naming_the_field(
    shared_api: RunningApi, params: dict[str, str], field: str
) -> None:
    answer = await shared_api.owner.get("/v1/usage", params=params)
    assert answer.status == 422, answer.text
    assert answer.body["error"] == "validation_error"
    assert [d["field"] for d in answer.body["details"]] == [field]
    assert answer.body["message"].startswith(f"{field}: ")
    assert answer.body["request_id"] == answer.request_id


async def test_without_accounting_a_report_is_a_503_that_says_why(shared_api: RunningApi) -> None:
    for headers in ({}, {"Accept": "text/csv"}):
        answer = await shared_api.owner.get("/v1/usage", headers=headers)
        assert answer.status == 503, answer.text
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.body["error"] == "unavailable"
        assert "accounting" in answer.body["message"]
        assert answer.body["request_id"] == answer.request_id


async def test_another_tenant_cannot_be_named(shared_api: RunningApi) -> None:
    victim, _ = await new_tenant(shared_api, "usage-victim", "usage-victim-admin")
    _, intruder = await new_tenant(shared_api, "usage-intruder", "usage-intruder-admin")
    for tenant in (victim, "t-nonexistent", "../v1/me"):
        answer = await intruder.get("/v1/usage", tenant=tenant)
        assert answer.status == 404, answer.text
        assert answer.body["error"] == "not_found"


@pytest.mark.parametrize(
    ("accept", "csv_wanted"),
    [
        (None, False),
        ("", False),
        ("text/csv", True),
        ("Text/CSV; charset=utf-8", True),
        ("application/json", False),
        ("*/*", False),
        ("text/csv, application/json", True),
        ("application/json, text/csv", False),
        ("application/json;q=0.5, text/csv", True),
        ("text/csv;q=0, application/json", False),
        ("text/csv;q=bogus", False),
        ("text/html", False),
    ],
)
def test_csv_is_given_when_accept_prefers_it(accept: str | None, csv_wanted: bool) -> None:
    assert wants_csv(accept) is csv_wanted


def test_a_group_a_spreadsheet_would_run_is_quoted_in_the_csv() -> None:
    groups = ["=HYPERLINK(1)", "+1", "-1", "@SUM(A1)", "\tx", "plain", 'a,"b"\nc']
    report = UsageReportOut(
        start=datetime(2026, 5, 1, tzinfo=UTC),
        end=datetime(2026, 5, 8, tzinfo=UTC),
        group_by=UsageGroupBy.tenant,
        items=[
            UsageItemOut(
                group=g, gpu_hours=1.5, cpu_core_hours=0.25, prompt_tokens=7, completion_tokens=3
            )
            for g in groups
        ],
        truncated=False,
    )
    rows = list(csv.reader(io.StringIO(as_csv(report))))
    assert rows[0] == list(CSV_COLUMNS)
    assert [r[0] for r in rows[1:]] == [
        "'=HYPERLINK(1)",
        "'+1",
        "'-1",
        "'@SUM(A1)",
        "'\tx",
        "plain",
        'a,"b"\nc',
    ]
    assert {tuple(r[1:]) for r in rows[1:]} == {("1.5", "0.25", "7", "3")}


def _csv_rows(text: str) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
    return [
        {
            "group": r["group"],
            "gpu_hours": float(r["gpu_hours"]),
            "cpu_core_hours": float(r["cpu_core_hours"]),
            "prompt_tokens": int(r["prompt_tokens"]),
            "completion_tokens": int(r["completion_tokens"]),
        }
        for r in reader
    ]


# --- with accounting --------------------------------------------------------------------------

T0 = datetime.now(UTC).replace(hour=20, minute=0, second=0, microsecond=0) - timedelta(days=20)
"""20:00 UTC some days ago: the allocations below end before the api's `now`, one crosses
midnight."""
NOW = T0 + timedelta(hours=12)
"""The api's clock while it reports: the open allocation counts up to here."""
WINDOW = {"from": (T0 - timedelta(hours=1)).isoformat(), "to": (T0 + timedelta(days=1)).isoformat()}
DAY1 = T0.date().isoformat()
DAY2 = (T0 + timedelta(days=1)).date().isoformat()


def _h(n: float) -> datetime:
    return T0 + timedelta(hours=n)


@dataclass
class World:
    """Two tenants' usage as accounting metered it from real events and token counts.

    Tenant A: its admin ann ran wA1 (2 x l40s-48gb, 4 cores) for 3 h and runs wA2 (1 GPU,
    1 core) since 10 h, open; member bob ran wB1 (cpu-2c-4g, 2 cores) for 1 h and then 2 h
    across midnight; member carl did nothing. Tenant B: cat ran wC1 (1 x h100-80gb, 8 cores)
    for 5 h. Tokens: ann's key 100/50, bob's 10/5 and 1/1 (the next day), cat's 1000/500.
    """

    api: RunningApi
    a: str
    b: str
    ann: Client
    bob: Client
    carl: Client
    cat: Client
    workloads: dict[str, str]


TENANT_A = {"gpu_hours": 8.0, "cpu_core_hours": 20.0, "prompt_tokens": 111, "completion_tokens": 56}
TENANT_B = {
    "gpu_hours": 5.0,
    "cpu_core_hours": 40.0,
    "prompt_tokens": 1000,
    "completion_tokens": 500,
}
ANN = {"gpu_hours": 8.0, "cpu_core_hours": 14.0, "prompt_tokens": 100, "completion_tokens": 50}
BOB = {"gpu_hours": 0.0, "cpu_core_hours": 6.0, "prompt_tokens": 11, "completion_tokens": 6}
CAT = TENANT_B
ZERO = {"gpu_hours": 0.0, "cpu_core_hours": 0.0, "prompt_tokens": 0, "completion_tokens": 0}


async def _launch(client: Client, class_name: str) -> str:
    made = await client.post("/v1/workloads", {"kind": "notebook", "class": class_name})
    assert made.status == 201, made.text
    workload_id: str = made.body["id"]
    return workload_id


async def _key(client: Client) -> str:
    made = await client.post("/v1/gateway/keys", {"name": "mine"})
    assert made.status == 201, made.text
    key_id: str = made.body["id"]
    return key_id


async def _world(api: RunningApi, bus: Bus) -> World:
    a, ann = await new_tenant(api, "physics", "ann")
    bob = await new_member(api, a, "bob", by=ann)
    carl = await new_member(api, a, "carl", by=ann)
    b, cat = await new_tenant(api, "chemistry", "cat")
    w = {
        "wA1": await _launch(ann, "l40s-48gb"),
        "wA2": await _launch(ann, "l40s-48gb"),
        "wB1": await _launch(bob, "cpu-2c-4g"),
        "wC1": await _launch(cat, "h100-80gb"),
    }
    keys = {"ann": await _key(ann), "bob": await _key(bob), "cat": await _key(cat)}

    scheduler, gateway = SchedulerPlayer(bus.js), GatewayPlayer(bus.js)
    runs = [
        (w["wA1"], a, held(2, placed_class="l40s-48gb", cpus=4), _h(0), _h(3)),
        (w["wA2"], a, held(1, placed_class="l40s-48gb", cpus=1), _h(10), None),
        (w["wB1"], a, held(0, placed_class="cpu-2c-4g", cpus=2), _h(1), _h(2)),
        (w["wB1"], a, held(0, placed_class="cpu-2c-4g", cpus=2), _h(3), _h(5)),
        (w["wC1"], b, held(1, placed_class="h100-80gb", cpus=8), _h(0), _h(5)),
    ]
    for workload_id, tenant_id, what, start, end in runs:
        await scheduler.run_for(workload_id, start, end, tenant_id=tenant_id, metered=what)
    for tenant_id, key_id, prompt, completion, at in (
        (a, keys["ann"], 100, 50, _h(1)),
        (a, keys["bob"], 10, 5, _h(2)),
        (a, keys["bob"], 1, 1, _h(4.5)),
        (b, keys["cat"], 1000, 500, _h(1)),
    ):
        usage = gateway.usage(
            at, tenant_id=tenant_id, key_id=key_id, prompt=prompt, completion=completion
        )
        await gateway.send(usage)
    await events_done(bus.js)
    await tokens_done(bus.js)
    api.service.clock = lambda: NOW
    return World(api, a, b, ann, bob, carl, cat, w)


@pytest_asyncio.fixture
async def accounting(bus: Bus, tmp_path: Path, data_dir: Path) -> AsyncIterator[str]:
    """Accounting on the test's bus, with a store of its own; yields its database URL."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'accounting.db'}"
    service = AccountingService(
        Settings(nats_url=bus.url, database_url=url, data_dir=data_dir),
        publish_debounce_s=0.05,
    )
    await service.start()
    try:
        yield url
    finally:
        await service.stop()


@pytest_asyncio.fixture
async def world(api: RunningApi, bus: Bus, accounting: str) -> World:
    """The world above, with accounting running (`accounting`) while the test reports."""
    return await _world(api, bus)


async def _report(client: Client, group_by: str, **params: str) -> dict[str, dict[str, Any]]:
    """The report's rows by group (each without its group), checked sorted and complete."""
    answer = await client.get("/v1/usage", params={**WINDOW, "group_by": group_by, **params})
    assert answer.status == 200, answer.text
    assert answer.body["truncated"] is False
    assert answer.body["group_by"] == group_by
    groups = [item["group"] for item in answer.body["items"]]
    assert groups == sorted(groups)
    rows = {item.pop("group"): item for item in answer.body["items"]}
    for row in rows.values():
        for name in ("gpu_hours", "cpu_core_hours"):
            row[name] = pytest.approx(row[name], abs=1e-9)
    return rows


async def test_each_caller_sees_what_is_theirs_to_see(
    api_on_store: RunningApi, bus: Bus, accounting: str
) -> None:
    world = await _world(api_on_store, bus)
    a, b = world.a, world.b
    owner = world.api.owner
    assert await _report(owner, "tenant") == {a: TENANT_A, b: TENANT_B}
    assert await _report(owner, "tenant", tenant=b) == {b: TENANT_B}
    assert await _report(world.ann, "tenant") == {a: TENANT_A}
    assert await _report(world.ann, "tenant", tenant=a) == {a: TENANT_A}
    assert await _report(world.cat, "tenant") == {b: TENANT_B}
    # A member: one row, their own share; a member who ran nothing, zeros.
    assert await _report(world.bob, "tenant") == {a: BOB}
    assert await _report(world.carl, "tenant") == {a: ZERO}
    # Users: each one's workloads' hours and keys' tokens; a member sees only their own.
    assert await _report(owner, "user") == {"ann": ANN, "bob": BOB, "cat": CAT}
    assert await _report(world.ann, "user") == {"ann": ANN, "bob": BOB}
    assert await _report(world.bob, "user") == {"bob": BOB}
    assert await _report(world.cat, "user") == {"cat": CAT}
    assert await _report(world.carl, "user") == {}
    # Another tenant cannot be named, by an admin or a member.
    for client in (world.ann, world.bob):
        assert (await client.get("/v1/usage", params={**WINDOW, "tenant": b})).status == 404


async def test_reports_by_workload_class_region_and_day(world: World) -> None:
    w = world.workloads
    cpu = dict(ZERO)
    assert await _report(world.bob, "workload") == {w["wB1"]: {**cpu, "cpu_core_hours": 6.0}}
    assert await _report(world.ann, "workload") == {
        w["wA1"]: {**cpu, "gpu_hours": 6.0, "cpu_core_hours": 12.0},
        w["wA2"]: {**cpu, "gpu_hours": 2.0, "cpu_core_hours": 2.0},  # open, counted to now
        w["wB1"]: {**cpu, "cpu_core_hours": 6.0},
    }
    # Classes and regions hold allocations; the tokens are in no class or region.
    assert await _report(world.ann, "class") == {
        "cpu-2c-4g": {**cpu, "cpu_core_hours": 6.0},
        "l40s-48gb": {**cpu, "gpu_hours": 8.0, "cpu_core_hours": 14.0},
    }
    assert await _report(world.api.owner, "region") == {
        "local": {**cpu, "gpu_hours": 13.0, "cpu_core_hours": 60.0}
    }
    # bob's second run is split at midnight UTC; his tokens fall on the day they were counted.
    assert await _report(world.bob, "day") == {
        DAY1: {**cpu, "cpu_core_hours": 4.0, "prompt_tokens": 10, "completion_tokens": 5},
        DAY2: {**cpu, "cpu_core_hours": 2.0, "prompt_tokens": 1, "completion_tokens": 1},
    }


async def test_a_report_by_endpoint_folds_replicas_into_their_endpoint(
    api: RunningApi, bus: Bus, accounting: str
) -> None:
    """An endpoint's hours and served tokens include its replicas'; a notebook is no endpoint;
    a member sees the tokens their own keys spent, by the endpoint that served them."""
    tenant_id, ann = await new_tenant(api, "physics", "ann")
    bob = await new_member(api, tenant_id, "bob", by=ann)
    spec = {"runtime": "llamacpp", "model": "/m/x.gguf", "replicas": 2}
    made = await ann.post(
        "/v1/workloads", {"kind": "endpoint", "class": "cpu-1c-2g", "name": "chat", "spec": spec}
    )
    assert made.status == 201, made.text
    chat = made.body["id"]
    listed = (await ann.get("/v1/workloads?kind=endpoint")).body["items"]
    (replica,) = [w["id"] for w in listed if w["replica_of"] == chat]
    notebook = await _launch(ann, "cpu-2c-4g")
    ann_key, bob_key = await _key(ann), await _key(bob)

    scheduler, gateway = SchedulerPlayer(bus.js), GatewayPlayer(bus.js)
    for workload_id, cpus, start, end in (
        (chat, 1, _h(0), _h(2)),
        (replica, 1, _h(0), _h(1)),
        (notebook, 2, _h(0), _h(3)),
    ):
        await scheduler.run_for(
            workload_id, start, end, tenant_id=tenant_id, metered=held(0, cpus=cpus)
        )
    for key_id, served_by, prompt, completion in (
        (ann_key, chat, 100, 20),
        (bob_key, replica, 10, 5),
        (ann_key, "w-long-gone", 1, 1),  # a replica the api no longer knows: still counted
    ):
        await gateway.send(
            gateway.usage(
                _h(1),
                tenant_id=tenant_id,
                key_id=key_id,
                endpoint=served_by,
                prompt=prompt,
                completion=completion,
            )
        )
    await events_done(bus.js)
    await tokens_done(bus.js)
    api.service.clock = lambda: NOW

    assert await _report(ann, "endpoint") == {
        chat: {**ZERO, "cpu_core_hours": 3.0, "prompt_tokens": 110, "completion_tokens": 25},
        "w-long-gone": {**ZERO, "prompt_tokens": 1, "completion_tokens": 1},
    }
    assert await _report(bob, "endpoint") == {
        chat: {**ZERO, "prompt_tokens": 10, "completion_tokens": 5}
    }


@pytest.mark.parametrize("group_by", ["tenant", "user", "day"])
async def test_the_csv_parses_and_matches_the_json(world: World, group_by: str) -> None:
    params = {**WINDOW, "group_by": group_by}
    as_json = await world.ann.get("/v1/usage", params=params)
    as_csv_ = await world.ann.get("/v1/usage", params=params, headers={"Accept": "text/csv"})
    assert as_csv_.status == 200, as_csv_.text
    assert as_csv_.headers["Content-Type"].startswith("text/csv")
    assert as_json.body["items"]
    assert _csv_rows(as_csv_.text) == as_json.body["items"]


async def test_without_accounting_a_report_is_a_503_naming_the_request(
    api: RunningApi, bus: Bus, tmp_path: Path, data_dir: Path
) -> None:
    """Accounting stopped: the next report is refused at once, not after a hang."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'accounting.db'}"
    service = AccountingService(Settings(nats_url=bus.url, database_url=url, data_dir=data_dir))
    await service.start()
    try:
        assert (await api.owner.get("/v1/usage")).status == 200
    finally:
        await service.stop()
    answer = await api.owner.get("/v1/usage", params={"group_by": "user"})
    assert answer.status == 503, answer.text
    assert "no accounting service is running" in answer.body["message"]
    assert answer.body["request_id"] == answer.request_id
