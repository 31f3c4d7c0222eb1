"""The dashboard's session cookie cannot be tossed in by a neighbour, and no api answer can be
sniffed into something else (issue 34, N16).

A workload's site, or any site under the same parent domain, can set a cookie for that parent
domain; a browser then sends it beside the dashboard's own, and the server used to take the
first one (login CSRF: the victim acts as the attacker's account). What a user relies on now:
- served over HTTPS, the cookie is `__Host-einsora_session` (Secure, host-only, path /), which
  only the dashboard's own origin can set; a cookie of the plain name is not a session there;
- over plain HTTP (Solo on localhost, where browsers refuse `__Host-` without Secure), a
  request that carries two session cookies is refused, whichever comes first;
- every api answer, errors included, says `X-Content-Type-Options: nosniff`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from einsora.api.testing import Client, RunningApi, link_code, new_tenant, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus

PLAIN = "einsora_session"
TLS = "__Host-einsora_session"


@pytest_asyncio.fixture
async def tls_api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api as served behind an HTTPS front (its public address is an https one)."""
    settings = Settings(
        nats_url=bus.url,
        database_url=sqlite_url,
        data_dir=data_dir,
        region="local",
        public_url="https://einsora.lab.example",
    )
    async with running_api(settings) as running:
        yield running


async def _signed_in(api: RunningApi, path: str) -> tuple[str, str, str]:
    """Sign in with a one-time link's path as the dashboard does: the Set-Cookie header, the
    cookie's name and its value."""
    anon = api.client(None)
    answer = await anon.post(
        "/v1/sessions/link", {"code": link_code(path)}, headers={"Origin": anon.base_url}
    )
    assert answer.status == 201, answer.text
    header = answer.headers["Set-Cookie"]
    name, _, rest = header.partition("=")
    return header, name, rest.split(";", 1)[0]


async def _link_of(client: Client) -> str:
    made = await client.post("/v1/sign-in-links", {})
    assert made.status == 201, made.text
    path: str = made.body["path"]
    return path


async def test_over_tls_the_cookie_is_host_prefixed_and_a_plain_one_is_not_a_session(
    tls_api: RunningApi,
) -> None:
    api = tls_api
    assert api.service.owner_sign_in_path is not None
    header, name, secret = await _signed_in(api, api.service.owner_sign_in_path)
    assert name == TLS
    attributes = {a.strip().split("=")[0].lower() for a in header.split(";")[1:]}
    assert attributes == {"path", "max-age", "httponly", "samesite", "secure"}  # no Domain
    assert "Path=/;" in header

    me = await api.client(None).get("/v1/me", headers={"Cookie": f"{TLS}={secret}"})
    assert me.status == 200, me.text
    assert me.body["user"]["username"] == "owner"
    # The plain name is what a sibling site could set for the parent domain: not a session.
    tossed = await api.client(None).get("/v1/me", headers={"Cookie": f"{PLAIN}={secret}"})
    assert tossed.status == 401
    assert tossed.body["request_id"] == tossed.request_id
    # Beside the real one, it changes nothing.
    both = await api.client(None).get(
        "/v1/me", headers={"Cookie": f"{PLAIN}=ses_{'x' * 43}; {TLS}={secret}"}
    )
    assert both.status == 200, both.text

    cookie = {"Cookie": f"{TLS}={secret}"}
    current = await api.client(None).get("/v1/sessions/current", headers=cookie)
    assert current.status == 200, current.text
    change = {**cookie, "Origin": api.url, "X-CSRF-Token": current.body["csrf_token"]}
    ended = await api.client(None).call("DELETE", "/v1/sessions/current", headers=change)
    assert ended.status == 204, ended.text
    cleared = ended.headers["Set-Cookie"]
    assert cleared.startswith(f"{TLS}=;")
    assert "Max-Age=0" in cleared
    assert "Secure" in cleared


async def test_over_plain_http_two_session_cookies_are_refused_whichever_comes_first(
    api: RunningApi,
) -> None:
    assert api.service.owner_sign_in_path is not None
    _, name, owners = await _signed_in(api, api.service.owner_sign_in_path)
    assert name == PLAIN
    # The attacker's own, valid session, tossed in for the parent domain.
    _, mallory = await new_tenant(api, "mallory", "mallory")
    _, _, theirs = await _signed_in(api, await _link_of(mallory))

    assert (await api.client(None).get("/v1/me", headers={"Cookie": f"{PLAIN}={owners}"})).body[
        "user"
    ]["username"] == "owner"
    for cookie in (f"{PLAIN}={theirs}; {PLAIN}={owners}", f"{PLAIN}={owners}; {PLAIN}={theirs}"):
        refused = await api.client(None).get("/v1/me", headers={"Cookie": f"a=1; {cookie}"})
        assert refused.status == 400, refused.text
        assert refused.body["error"] == "ambiguous_session_cookie"
        assert refused.body["request_id"] == refused.request_id
        assert "two" in refused.body["message"]
    # An API token is untouched by whatever cookies come with it.
    bearer = await api.owner.get("/v1/me", headers={"Cookie": f"{PLAIN}={theirs}; {PLAIN}=x"})
    assert bearer.status == 200


async def test_every_api_answer_says_nosniff(api: RunningApi) -> None:
    anon = api.client(None)
    answers = [
        await anon.get("/healthz"),
        await anon.get("/openapi.json"),
        await api.owner.get("/v1/me"),
        await anon.get("/v1/me"),  # 401
        await anon.get("/v1/nowhere"),  # 404
        await api.owner.post("/v1/workloads", {"kind": "nope"}),  # 422
        await api.owner.call("POST", "/v1/workloads", data=b"{"),  # 400
        await anon.call("PUT", "/healthz"),  # 405
    ]
    for answer in answers:
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", (
            answer.status,
            answer.text,
        )
    stream = await api.session.get(
        api.url + "/v1/events", headers={"Authorization": f"Bearer {api.owner.token}"}
    )
    try:
        assert stream.status == 200
        assert stream.headers["X-Content-Type-Options"] == "nosniff"
    finally:
        stream.close()
