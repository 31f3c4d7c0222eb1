"""Password sign-ins are locked out in the store, atomically (issue 34, N5).

A burst of guesses is decided one attempt at a time by the store, on SQLite and Postgres: no
more than the limit are ever checked against the password, the right password after them is
refused too, and two api replicas share the count. The client's address is the connection's
unless it came from a configured trusted proxy, so `X-Forwarded-For` from anyone else changes
nothing. Every failed or refused sign-in of a known user is in their tenant's activity log,
without the password.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
import sqlalchemy as sa

from einsora.api.passwords import MAX_FAILURES_PER_ADDRESS, MAX_FAILURES_PER_USER
from einsora.api.testing import RunningApi, new_tenant, running_api, sign_in
from einsora.common.settings import Settings
from einsora.common.testing import Bus

PASSWORD = "correct horse battery staple"


def _settings(bus: Bus, database_url: str, data_dir: Path, trusted_proxies: str = "") -> Settings:
    # The routes that take no token have a request rate per address as well (N15); off here,
    # so that every refusal these tests see is the lockout's.
    return Settings(
        nats_url=bus.url,
        database_url=database_url,
        data_dir=data_dir,
        api_unauthenticated_requests_per_minute=0,
        trusted_proxies=trusted_proxies,
    )


@pytest_asyncio.fixture
async def api_on_store(bus: Bus, store_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api on each engine (SQLite, and Postgres when one answers)."""
    async with running_api(_settings(bus, store_url, data_dir)) as running:
        yield running


@pytest_asyncio.fixture
async def api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    async with running_api(_settings(bus, sqlite_url, data_dir)) as running:
        yield running


def _locked_out(answer: Any) -> None:
    """A refusal by the lockout (not by another limit), with its request ID."""
    assert answer.status == 429, answer.text
    assert answer.body["details"][0]["field"] == "password", answer.text
    assert "too many failed sign-ins" in answer.body["message"]
    assert answer.body["request_id"] == answer.request_id
    assert int(answer.headers["Retry-After"]) > 0


async def _member_with_password(api: RunningApi, username: str) -> str:
    """A new member of a new tenant with `PASSWORD`: the tenant's id."""
    tenant_id, admin = await new_tenant(api, f"{username}-team", f"{username}-admin")
    made = await admin.post(f"/v1/tenants/{tenant_id}/invitations", {"username": username})
    assert made.status == 201, made.text
    await sign_in(
        api.client(None),
        "/v1/sessions/invitation",
        {"code": made.body["code"], "password": PASSWORD},
    )
    return tenant_id


async def _many(
    api: RunningApi, bodies: list[dict[str, Any]], headers: list[dict[str, str]]
) -> list[int]:
    """POST each body to /v1/sessions at once, each on a connection of its own: the statuses."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(body: dict[str, Any], extra: dict[str, str]) -> int:
            async with http.post(
                f"{api.url}/v1/sessions", json=body, headers={"Origin": api.url, **extra}
            ) as resp:
                await resp.read()
                return resp.status

        return list(
            await asyncio.gather(*(one(b, h) for b, h in zip(bodies, headers, strict=True)))
        )


async def test_a_burst_of_guesses_checks_no_more_than_the_limit(api_on_store: RunningApi) -> None:
    api = api_on_store
    await _member_with_password(api, "bob")
    guesses = [{"username": "bob", "password": f"guess number {i}"} for i in range(150)]
    bodies = [*guesses, {"username": "bob", "password": PASSWORD}]
    statuses = await _many(api, bodies, [{}] * len(bodies))

    checked = [s for s in statuses if s != 429]
    assert len(checked) <= MAX_FAILURES_PER_USER, statuses
    assert set(statuses) <= {401, 429, 201}
    right = await api.client(None).post(
        "/v1/sessions", {"username": "bob", "password": PASSWORD}, headers={"Origin": api.url}
    )
    _locked_out(right)


async def test_two_replicas_share_one_lockout(bus: Bus, sqlite_url: str, data_dir: Path) -> None:
    settings = _settings(bus, sqlite_url, data_dir)
    async with running_api(settings) as first, running_api(settings) as second:
        await _member_with_password(first, "bob")
        for i in range(MAX_FAILURES_PER_USER):
            replica = (first, second)[i % 2]
            wrong = await replica.client(None).post(
                "/v1/sessions",
                {"username": "bob", "password": f"guess {i}"},
                headers={"Origin": replica.url},
            )
            assert wrong.status == 401, wrong.text
        for replica in (first, second):
            right = await replica.client(None).post(
                "/v1/sessions",
                {"username": "bob", "password": PASSWORD},
                headers={"Origin": replica.url},
            )
            _locked_out(right)


def _wrong_guesses(count: int) -> list[dict[str, Any]]:
    # A username each, so only the limit per address can refuse them.
    return [{"username": f"nobody-{i}", "password": "not it at all"} for i in range(count)]


async def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(api: RunningApi) -> None:
    count = MAX_FAILURES_PER_ADDRESS
    forged = [{"X-Forwarded-For": f"198.51.100.{i}"} for i in range(count)]
    statuses = await _many(api, _wrong_guesses(count), forged)
    assert statuses == [401] * count
    # Every one of them came from this test's own address, whatever the header said.
    more = await _many(api, _wrong_guesses(1), [{"X-Forwarded-For": "203.0.113.9"}])
    assert more == [429]


async def test_x_forwarded_for_from_a_trusted_proxy_names_the_client(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir, trusted_proxies="10.9.9.0/24, 127.0.0.1/32")
    async with running_api(settings) as api:
        count = MAX_FAILURES_PER_ADDRESS
        one_client = [{"X-Forwarded-For": "198.51.100.7"}] * count
        assert await _many(api, _wrong_guesses(count), one_client) == [401] * count
        assert await _many(api, _wrong_guesses(1), one_client[:1]) == [429]
        # Another client behind the same proxy is someone else.
        assert await _many(api, _wrong_guesses(1), [{"X-Forwarded-For": "198.51.100.8"}]) == [401]


async def _activity(api: RunningApi, request_id: str) -> list[dict[str, Any]]:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        rows = await conn.execute(
            sa.text("SELECT * FROM activity WHERE request_id = :r"), {"r": request_id}
        )
        return [dict(r) for r in rows.mappings().all()]


async def _everything(api: RunningApi) -> AsyncIterator[str]:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        for row in (await conn.execute(sa.text("SELECT * FROM activity"))).mappings().all():
            yield json.dumps(dict(row), default=str)


async def test_failed_sign_ins_are_in_the_activity_log(api: RunningApi) -> None:
    tenant_id = await _member_with_password(api, "bob")
    anon = api.client(None)
    bob_id = None
    for i in range(MAX_FAILURES_PER_USER + 1):
        answer = await anon.post(
            "/v1/sessions",
            {"username": "bob", "password": f"a wrong guess {i}"},
            headers={"Origin": api.url, "X-Request-ID": f"guess-{i}"},
        )
        assert answer.status == (401 if i < MAX_FAILURES_PER_USER else 429)
        [row] = await _activity(api, f"guess-{i}")
        assert (row["tenant_id"], row["action"], row["outcome"]) == (
            tenant_id,
            "session.begin",
            "failed",
        )
        assert row["status"] == answer.status
        assert row["route"] == "POST /v1/sessions"
        assert row["token_id"] is None
        bob_id = bob_id or row["user_id"]
        assert row["user_id"] == bob_id is not None
    unknown = await anon.post(
        "/v1/sessions",
        {"username": "nobody", "password": "a wrong guess"},
        headers={"Origin": api.url, "X-Request-ID": "nobody"},
    )
    assert unknown.status == 401
    assert await _activity(api, "nobody") == []  # no tenant of anyone's to record it in
    logged = [line async for line in _everything(api)]
    assert not [line for line in logged if "a wrong guess" in line or PASSWORD in line]
