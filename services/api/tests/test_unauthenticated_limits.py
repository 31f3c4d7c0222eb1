"""Routes that take no API token are rate limited per client address, and a join opens no
write until its token checks out (issue 34, N15).

3,000 bad joins once raised an owner's request from 51 ms to 580 ms (median): each opened a
write transaction (one at a time on SQLite) before looking its token up. What a client relies
on now: past the limit, a 429 with `Retry-After` and the request ID, whatever the route (joins,
sign-ins, invitations) and whatever `X-Forwarded-For` says; no bad join writes anything; joins
from elsewhere, and every authenticated request, go on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import sqlalchemy as sa
from fastapi.routing import APIRoute

from einsora.api.app import _app, openapi_document
from einsora.api.deps import context
from einsora.api.store import Store
from einsora.api.testing import Client, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus

LIMIT = 10
TOKENS = "/v1/machines/join-tokens"
_WRITES = ("BEGIN IMMEDIATE", "INSERT", "UPDATE", "DELETE")


@contextmanager
def _writes(store: Store) -> Iterator[list[str]]:
    """The write statements (and write transactions begun) on the api's store in the block."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith(_WRITES):
            seen.append(statement)

    engine = store.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


async def _join(client: Client, token: str, **headers: str) -> Any:
    return await client.post(
        "/v1/machines/join", {"token": token, "hostname": "box"}, headers=headers
    )


async def test_a_flood_of_bad_joins_writes_nothing_and_is_cut_off_past_the_limit(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = Settings(
        nats_url=bus.url,
        database_url=sqlite_url,
        data_dir=data_dir,
        region="local",
        api_unauthenticated_requests_per_minute=LIMIT,
    )
    async with running_api(settings) as api:
        store = api.service.store
        assert store is not None
        made = await api.owner.post(TOKENS, {"tunnel": False, "uses": 2})
        assert made.status == 201, made.text
        revoked = await api.owner.post(TOKENS, {"tunnel": False})
        assert (await api.owner.delete(f"{TOKENS}/{revoked.body['id']}")).status == 204
        commits = store.commits
        anon = api.client(None)
        answers = []
        with _writes(store) as writes:
            for i in range(LIMIT + 5):
                bad = revoked.body["token"] if i % 2 else f"agt_{i:043d}"
                # A client's own say of its address is not believed.
                answers.append(await _join(anon, bad, **{"X-Forwarded-For": f"10.0.0.{i}"}))
            # Past the limit, even a good token from this address waits: the refusal comes
            # before the token is looked at.
            good_here = await _join(anon, made.body["token"])
            # Every unauthenticated route of this address shares the one budget.
            sign_in = await anon.post(
                "/v1/sessions",
                {"username": "owner", "password": "not the password"},
                headers={"Origin": anon.base_url},
            )
        assert writes == [], writes
        assert store.commits == commits
        assert [a.status for a in answers] == [401] * LIMIT + [429] * 5
        assert {a.body["error"] for a in answers[:LIMIT]} == {"join_token_invalid"}
        refused = answers[-1]
        assert refused.body["error"] == "rate_limited"
        assert refused.body["request_id"] == refused.request_id
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert [d["field"] for d in refused.body["details"]] == [
            "unauthenticated_requests_per_minute"
        ]
        assert f"{LIMIT} requests per minute" in refused.body["message"]
        assert good_here.status == 429
        assert sign_in.status == 429
        # A probe checks no credential: a flood never takes the api out of a load balancer.
        assert (await anon.get("/readyz")).status == 200
        # Not a use of the good token was spent.
        listed = {t["id"]: t["used"] for t in (await api.owner.get(TOKENS)).body["items"]}
        assert listed[made.body["id"]] == 0

        # Authenticated requests from the same address count against their account instead.
        assert (await api.owner.get("/v1/me")).status == 200
        # A machine elsewhere joins with the good token.
        elsewhere = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=elsewhere) as session:
            joined = await _join(Client(session, api.url, None), made.body["token"])
        assert joined.status == 201, joined.text
        listed = {t["id"]: t["used"] for t in (await api.owner.get(TOKENS)).body["items"]}
        assert listed[made.body["id"]] == 1


def test_every_route_that_takes_no_token_documents_its_429() -> None:
    document = openapi_document()
    anonymous = [
        route
        for route in _app().router.routes
        if isinstance(route, APIRoute)
        and route.include_in_schema
        and any(d.call is context for d in route.dependant.dependencies)
    ]
    assert anonymous  # joins, sign-ins, invitations
    for route in anonymous:
        for method in route.methods or ():
            operation = document["paths"][route.path_format][method.lower()]
            assert "429" in operation["responses"], (method, route.path_format)
