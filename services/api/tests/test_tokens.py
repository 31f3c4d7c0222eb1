"""API tokens: shown once, stored only as a hash, refused at once when revoked or expired."""

from __future__ import annotations

import asyncio
import hashlib
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from einsora.api.testing import RunningApi, eventually, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus


async def _table(api: RunningApi) -> list[dict[str, object]]:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        rows = (await conn.execute(sa.text("SELECT * FROM api_tokens"))).mappings().all()
    return [dict(r) for r in rows]


async def test_owner_token_is_written_once_with_mode_0600(api: RunningApi) -> None:
    path = api.service.owner_token_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert secret == api.service.owner_token_created
    assert secret.startswith("tsk_")
    me = await api.owner.get("/v1/me")
    assert me.body["user"]["username"] == "owner"
    assert me.body["role"] == "admin"
    assert me.body["operator"] is True


async def test_owner_is_made_only_on_the_first_start(api: RunningApi) -> None:
    from einsora.api.bootstrap import ensure_owner

    assert api.service.store is not None
    before = api.service.owner_token_path.read_text()
    assert await ensure_owner(api.service.store, api.service.settings.data_dir) is None
    assert api.service.owner_token_path.read_text() == before


async def test_token_lifecycle(api_on_store: RunningApi) -> None:
    api = api_on_store
    created = await api.owner.post("/v1/tokens", {"name": "laptop", "expires_in_days": 30})
    assert created.status == 201
    secret = created.body["token"]
    assert secret.startswith("tsk_")
    assert set(created.body) == {"id", "name", "token", "created_at", "expires_at", "operator"}
    expires = datetime.fromisoformat(created.body["expires_at"])
    assert timedelta(days=29) < expires - datetime.now(UTC) <= timedelta(days=30)

    # The secret is never shown again, and the store holds only its hash.
    listed = await api.owner.get("/v1/tokens")
    assert {t["name"] for t in listed.body["items"]} == {"owner", "laptop"}
    assert secret not in listed.text
    assert all("token" not in t for t in listed.body["items"])
    rows = await _table(api)
    assert all(secret not in str(value) for row in rows for value in row.values())
    assert hashlib.sha256(secret.encode()).hexdigest() in {r["secret_sha256"] for r in rows}
    owner_secret = api.owner.token
    assert owner_secret is not None
    assert all(owner_secret not in str(value) for row in rows for value in row.values())

    laptop = api.client(secret)
    me = await laptop.get("/v1/me")
    assert me.status == 200
    used = await api.owner.get("/v1/tokens")
    [row] = [t for t in used.body["items"] if t["id"] == created.body["id"]]
    assert row["last_used_at"] is not None

    # Revoked: refused from the very next request.
    revoked = await api.owner.delete(f"/v1/tokens/{created.body['id']}")
    assert revoked.status == 204
    refused = await laptop.get("/v1/me")
    assert refused.status == 401
    assert refused.body["error"] == "unauthenticated"
    assert "revoked" in refused.body["message"]
    assert refused.body["request_id"] == refused.request_id
    assert refused.headers["WWW-Authenticate"] == "Bearer"
    again = await api.owner.delete(f"/v1/tokens/{created.body['id']}")
    assert again.status == 404


async def test_an_expired_token_is_refused_at_once(api_on_store: RunningApi) -> None:
    api = api_on_store
    created = await api.owner.post("/v1/tokens", {"name": "short", "expires_in_days": 1})
    short = api.client(created.body["token"])
    assert (await short.get("/v1/me")).status == 200
    assert (await short.get("/v1/me")).status == 200  # verified once, now from the cache
    api.service.clock = lambda: datetime.now(UTC) + timedelta(days=1, seconds=1)  # a day passes
    refused = await short.get("/v1/me")
    assert refused.status == 401
    assert "expired" in refused.body["message"]


async def test_missing_unknown_and_malformed_tokens_are_401(api: RunningApi) -> None:
    for token, words in (
        (None, "missing"),
        ("tsk_" + "a" * 43, "unknown"),
        ("not-a-token", "malformed"),
    ):
        answer = await api.client(token).get("/v1/workloads")
        assert answer.status == 401, token
        assert words in answer.body["message"]
    raw = await api.owner.call("GET", "/v1/me", headers={"Authorization": "Basic Zm9vOmJhcg=="})
    assert raw.status == 401


async def test_a_revoked_token_is_refused_from_the_next_request_during_a_burst(
    api: RunningApi,
) -> None:
    """Verified tokens are cached, yet a revocation holds at once: while a burst of requests
    with the token is in flight, every request sent after the DELETE answered is refused."""
    created = await api.owner.post("/v1/tokens", {"name": "burst"})
    laptop = api.client(created.body["token"])
    assert (await laptop.get("/v1/me")).status == 200
    revoked_at: list[float] = []
    outcomes: list[tuple[float, int]] = []
    under_way = asyncio.Event()

    async def caller() -> None:
        while len(outcomes) < 600:
            sent = time.monotonic()
            reply = await laptop.get("/v1/workloads?limit=1")
            outcomes.append((sent, reply.status))
            if len(outcomes) >= 100:
                under_way.set()
            if revoked_at and sent > revoked_at[0] + 0.5:
                return

    async def revoker() -> None:
        await under_way.wait()
        reply = await api.owner.delete(f"/v1/tokens/{created.body['id']}")
        assert reply.status == 204
        revoked_at.append(time.monotonic())

    await asyncio.gather(*(caller() for _ in range(16)), revoker())
    [cut] = revoked_at
    before = [status for sent, status in outcomes if sent < cut]
    after = [status for sent, status in outcomes if sent > cut]
    assert 200 in before  # the token worked, from the cache, until then
    assert after, "no request was sent after the revocation"
    assert set(after) == {401}, f"{after.count(200)} requests sent after it were served"
    assert api.service.tokens is not None
    assert api.service.tokens.hits > 0  # the burst was served from the cache


async def test_a_revocation_on_one_replica_reaches_another_over_the_bus(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    """Two api replicas on one store: a token verified (and cached) by both is revoked on one;
    the other refuses it within a moment (the bus), not after the cache's TTL."""
    settings = Settings(nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir)
    async with running_api(settings) as first, running_api(settings) as second:
        assert second.service.tokens is not None
        assert second.service.tokens.ttl_s >= 30
        created = await first.owner.post("/v1/tokens", {"name": "both"})
        on_first = first.client(created.body["token"])
        on_second = second.client(created.body["token"])
        assert (await on_first.get("/v1/me")).status == 200
        assert (await on_second.get("/v1/me")).status == 200
        assert (await on_second.get("/v1/me")).status == 200  # cached there now

        assert (await first.owner.delete(f"/v1/tokens/{created.body['id']}")).status == 204
        assert (await on_first.get("/v1/me")).status == 401

        async def refused_on_second() -> bool:
            return (await on_second.get("/v1/me")).status == 401

        await eventually(refused_on_second, within_s=2.0)
