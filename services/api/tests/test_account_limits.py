"""Accounts, not tokens, carry limits (issue 34, N12): a user's requests, launches and open
event streams in a tenant count together, whichever of their API tokens or dashboard sessions
makes them, so minting more tokens buys no more of anything. Another user's budget is their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from einsora.api.testing import Client, RunningApi, new_member, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus

NOTEBOOK = {"kind": "notebook", "class": "cpu-1c-2g"}


def _settings(bus: Bus, sqlite_url: str, data_dir: Path, **limits: Any) -> Settings:
    return Settings(
        nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir, region="local", **limits
    )


async def _second_token(api: RunningApi, client: Client) -> Client:
    made = await client.post("/v1/tokens", {"name": "another"})
    assert made.status == 201, made.text
    return api.client(made.body["token"])


async def test_two_tokens_of_one_user_share_one_request_budget(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir, api_requests_per_minute=6)
    async with running_api(settings) as api:
        ann = await new_member(api, await _owner_tenant(api), "ann")  # the owner's: 2 requests
        first = await _second_token(api, api.owner)  # 3
        for _ in range(3):  # 4, 5, 6: the owner's budget is spent
            assert (await api.owner.get("/v1/me")).status == 200
        refused = await first.get("/v1/me")  # a fresh token of the same user
        assert refused.status == 429, refused.text
        assert refused.body["error"] == "rate_limited"
        assert refused.body["request_id"] == refused.request_id
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert [d["field"] for d in refused.body["details"]] == ["requests_per_minute"]
        assert "6 requests per minute" in refused.body["message"]
        # A token minted now buys nothing either (the mint itself is refused).
        assert (await api.owner.post("/v1/tokens", {"name": "more"})).status == 429
        # Another user of the tenant has a budget of their own.
        assert (await ann.get("/v1/me")).status == 200
        assert (await (await _second_token(api, ann)).get("/v1/me")).status == 200


async def test_two_tokens_of_one_user_share_one_launch_budget(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir, api_launches_per_minute=2)
    async with running_api(settings) as api:
        other = await _second_token(api, api.owner)
        assert (await api.owner.post("/v1/workloads", NOTEBOOK)).status == 201
        assert (await other.post("/v1/workloads", NOTEBOOK)).status == 201
        refused = await other.post("/v1/workloads", NOTEBOOK)
        assert refused.status == 429, refused.text
        assert [d["field"] for d in refused.body["details"]] == ["launches_per_minute"]
        assert (await api.owner.post("/v1/workloads", NOTEBOOK)).status == 429
        assert (await other.get("/v1/workloads")).status == 200  # other requests go on


async def test_two_tokens_of_one_user_share_one_bound_on_open_streams(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir, api_streams_per_token=2)
    async with running_api(settings) as api:
        ann = await new_member(api, await _owner_tenant(api), "ann")
        tokens = [api.owner.token, (await _second_token(api, api.owner)).token]
        opened = [await _open_stream(api, token) for token in tokens]
        try:
            for response in opened:
                assert response.status == 200, await response.text()
            refused = await _open_stream(api, (await _second_token(api, api.owner)).token)
            assert refused.status == 429
            body = await refused.json()
            assert body["error"] == "rate_limited"
            assert body["request_id"] == refused.headers["X-Request-ID"]
            assert body["details"][0]["field"] == "streams_per_token"
            assert "2 open event streams" in body["message"]
            # Another user's streams are their own.
            theirs = await _open_stream(api, ann.token)
            assert theirs.status == 200
            theirs.close()
        finally:
            for response in opened:
                response.close()


async def _owner_tenant(api: RunningApi) -> str:
    me = await api.owner.get("/v1/me")
    assert me.status == 200, me.text
    tenant: str = me.body["tenant"]["id"]
    return tenant


async def _open_stream(api: RunningApi, token: str | None) -> aiohttp.ClientResponse:
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    return await api.session.get(api.url + "/v1/events", headers=headers)
