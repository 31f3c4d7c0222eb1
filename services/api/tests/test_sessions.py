"""Dashboard sessions against a real api, bus and store (ADR-0019).

The owner's first-start link signs in exactly once; a new member's invitation link makes them
with the password they choose; passwords are Argon2id hashes, never logged, throttled when
guessed; the cookie is host-only, HttpOnly and SameSite=Strict; a change made with a session
needs its CSRF token and the dashboard's own origin; signing out (or changing the password)
ends a session on the server at once; idle and old sessions end by themselves.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.testing import (
    RunningApi,
    SessionClient,
    link_code,
    new_tenant,
    running_api,
    sign_in,
)
from einsora.common.settings import Settings
from einsora.common.testing import Bus

PASSWORD = "correct horse battery staple"


async def _owner_session(api: RunningApi) -> SessionClient:
    path = api.service.owner_sign_in_path
    assert path is not None
    signed_in, _ = await sign_in(api.client(None), "/v1/sessions/link", {"code": link_code(path)})
    return signed_in


async def _invited(api: RunningApi, tenant_id: str, admin_username: str) -> str:
    """The one-time code of an invitation of a new user into the tenant."""
    made = await api.owner.post(
        f"/v1/tenants/{tenant_id}/invitations", {"username": admin_username, "role": "member"}
    )
    assert made.status == 201, made.text
    code: str = made.body["code"]
    return code


async def test_the_first_start_link_signs_the_owner_in_once(api: RunningApi) -> None:
    path = api.service.owner_sign_in_path
    assert path is not None
    assert path.startswith("/sign-in#link=sil_")  # the code rides in the fragment
    anon = api.client(None)
    answer = await anon.post(
        "/v1/sessions/link", {"code": link_code(path)}, headers={"Origin": anon.base_url}
    )
    assert answer.status == 201, answer.text
    cookie = answer.headers["Set-Cookie"]
    attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert attributes == {"path", "max-age", "httponly", "samesite"}  # no Domain: host-only
    assert "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain HTTP here; under TLS it is Secure
    assert answer.headers["Cache-Control"] == "no-store"
    body = answer.body
    assert (body["user"]["username"], body["role"], body["operator"]) == ("owner", "admin", True)
    assert body["method"] == "link"
    assert body["has_password"] is False

    again = await anon.post(
        "/v1/sessions/link", {"code": link_code(path)}, headers={"Origin": anon.base_url}
    )
    assert again.status == 401
    assert again.body["error"] == "sign_in_link_refused"
    assert again.body["request_id"] == again.request_id


async def test_a_session_acts_as_its_user_and_sign_out_ends_it_on_the_server(
    api: RunningApi,
) -> None:
    owner = await _owner_session(api)
    me = await owner.get("/v1/me")
    assert me.status == 200
    assert me.body["user"]["username"] == "owner"
    current = await owner.get("/v1/sessions/current")
    assert current.status == 200
    assert current.body["csrf_token"] == owner.csrf

    ended = await owner.delete("/v1/sessions/current")
    assert ended.status == 204
    assert "Max-Age=0" in ended.headers["Set-Cookie"]
    refused = await owner.get("/v1/me")  # the old cookie, sent again as a thief would
    assert refused.status == 401
    assert refused.body["error"] == "session_ended"
    assert (await owner.get("/v1/sessions/current")).status == 401


async def test_a_change_needs_the_csrf_token_and_the_dashboards_origin(api: RunningApi) -> None:
    owner = await _owner_session(api)
    before = (await owner.get("/v1/tokens")).body["items"]

    no_token = await owner.post("/v1/tokens", {"name": "x"}, headers={"X-CSRF-Token": "nope"})
    assert no_token.status == 403
    assert no_token.body["error"] == "csrf_failed"
    cross_site = await owner.post(
        "/v1/tokens", {"name": "x"}, headers={"Origin": "http://evil.example"}
    )
    assert cross_site.status == 403
    assert cross_site.body["error"] == "cross_site_request"
    sibling = await owner.post("/v1/tokens", {"name": "x"}, headers={"Sec-Fetch-Site": "same-site"})
    assert sibling.status == 403
    assert (await owner.get("/v1/tokens")).body["items"] == before  # nothing was made

    made = await owner.post("/v1/tokens", {"name": "from the dashboard"})
    assert made.status == 201, made.text
    # A GET needs neither: an event stream or a download is a plain request.
    listed = await owner.get("/v1/workloads", headers={"Origin": "http://evil.example"})
    assert listed.status == 200


async def test_an_api_token_wins_over_a_cookie_and_needs_no_csrf_token(api: RunningApi) -> None:
    owner = await _owner_session(api)
    both = await api.owner.post(
        "/v1/tokens",
        {"name": "bearer"},
        headers={"Cookie": f"einsora_session={owner.cookie}", "Origin": "http://evil.example"},
    )
    assert both.status == 201  # the bearer path, as before: no session, no CSRF check
    as_bearer = await api.owner.get("/v1/sessions/current")
    assert as_bearer.status == 404


async def test_an_invitation_link_makes_the_member_with_their_password(
    api: RunningApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tenant_id, _ = await new_tenant(api, "acme", "acme-admin")
    code = await _invited(api, tenant_id, "ann")
    anon = api.client(None)

    short = await anon.post(
        "/v1/sessions/invitation",
        {"code": code, "password": "tiny-pw-x9"},
        headers={"Origin": anon.base_url},
    )
    assert short.status == 422
    assert short.body["details"][0]["field"] == "password"
    assert "tiny-pw-x9" not in short.text  # the password is never echoed

    ann, joined = await sign_in(
        anon, "/v1/sessions/invitation", {"code": code, "password": PASSWORD}
    )
    assert (joined.body["user"]["username"], joined.body["tenant"]["name"]) == ("ann", "acme")
    assert (joined.body["role"], joined.body["operator"]) == ("member", False)
    assert (await ann.get("/v1/me")).body["tenant"]["id"] == tenant_id
    assert (await ann.get("/v1/tokens")).body["items"] == []  # no API token was made for her

    assert api.service.store is not None
    async with api.service.store.read() as conn:
        stored = await conn.scalar(
            sa.select(m.users.c.password_hash).where(m.users.c.username == "ann")
        )
    assert stored is not None
    assert stored.startswith("$argon2id$")
    assert PASSWORD not in stored

    used = await anon.post(
        "/v1/sessions/invitation",
        {"code": code, "password": PASSWORD},
        headers={"Origin": anon.base_url},
    )
    assert used.status == 404  # the invitation was used

    again, _ = await sign_in(anon, "/v1/sessions", {"username": "ann", "password": PASSWORD})
    assert (await again.get("/v1/me")).body["user"]["username"] == "ann"
    wrong = await anon.post(
        "/v1/sessions",
        {"username": "ann", "password": PASSWORD + "!"},
        headers={"Origin": anon.base_url},
    )
    nobody = await anon.post(
        "/v1/sessions",
        {"username": "nobody", "password": PASSWORD},
        headers={"Origin": anon.base_url},
    )
    assert (wrong.status, nobody.status) == (401, 401)
    assert wrong.body["message"] == nobody.body["message"]  # which one was wrong is not said
    leaks = [r.getMessage() for r in caplog.records if PASSWORD in r.getMessage()]
    assert leaks == []


async def test_guessing_a_password_is_throttled(api: RunningApi) -> None:
    tenant_id, _ = await new_tenant(api, "acme", "acme-admin")
    anon = api.client(None)
    await sign_in(
        anon,
        "/v1/sessions/invitation",
        {"code": await _invited(api, tenant_id, "bob"), "password": PASSWORD},
    )
    statuses = []
    for guess in range(11):
        answer = await anon.post(
            "/v1/sessions",
            {"username": "bob", "password": f"guess number {guess}"},
            headers={"Origin": anon.base_url},
        )
        statuses.append(answer.status)
    assert statuses == [401] * 10 + [429]
    right = await anon.post(
        "/v1/sessions", {"username": "bob", "password": PASSWORD}, headers={"Origin": anon.base_url}
    )
    assert right.status == 429  # even the right one, until the window passes
    assert int(right.headers["Retry-After"]) > 0


async def test_a_sign_in_from_another_site_or_a_workload_site_is_refused(
    api: RunningApi,
) -> None:
    path = api.service.owner_sign_in_path
    assert path is not None
    anon = api.client(None)
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Host": f"w-0000000000aaaaaaaaaa.localhost:{api.service.settings.proxy_port}"},
    ):
        answer = await anon.post("/v1/sessions/link", {"code": link_code(path)}, headers=headers)
        assert answer.status == 403, (headers, answer.text)
    # None of them spent the link.
    assert (await anon.post("/v1/sessions/link", {"code": link_code(path)})).status == 201


async def test_passwords_are_set_then_changed_with_the_current_one(api: RunningApi) -> None:
    owner = await _owner_session(api)
    other = await _owner_session_from_new_link(api)  # a second browser
    first = await owner.call("PUT", "/v1/me/password", {"password": PASSWORD})
    assert first.status == 204, first.text
    assert (await other.get("/v1/me")).status == 401  # other sessions end with the change
    assert (await owner.get("/v1/sessions/current")).body["has_password"] is True

    change = await owner.call("PUT", "/v1/me/password", {"password": "a new long passphrase"})
    assert change.status == 422
    assert change.body["details"][0]["field"] == "current_password"
    wrong = await owner.call(
        "PUT",
        "/v1/me/password",
        {"current_password": "not it at all", "password": "a new long passphrase"},
    )
    assert wrong.status == 422
    same_as_name = await owner.call(
        "PUT", "/v1/me/password", {"current_password": PASSWORD, "password": "OWNER"}
    )
    assert same_as_name.status == 422  # too short as well; either way named
    ok = await owner.call(
        "PUT",
        "/v1/me/password",
        {"current_password": PASSWORD, "password": "a new long passphrase"},
    )
    assert ok.status == 204
    anon = api.client(None)
    _signed_in, answer = await sign_in(
        anon, "/v1/sessions", {"username": "owner", "password": "a new long passphrase"}
    )
    assert answer.body["operator"] is True  # the operator's own password


async def test_sign_in_links_are_minted_for_the_caller_and_expire(api: RunningApi) -> None:
    tenant_id, admin = await new_tenant(api, "acme", "acme-admin")
    made = await admin.post("/v1/sign-in-links", {"expires_in_minutes": 1})
    assert made.status == 201, made.text
    assert made.body["path"] == "/sign-in#link=" + made.body["code"]
    later = await api.owner.post("/v1/sign-in-links", {})
    api.service.clock = lambda: datetime.now(UTC) + timedelta(minutes=2)
    anon = api.client(None)
    expired = await anon.post("/v1/sessions/link", {"code": made.body["code"]})
    assert expired.status == 401
    _session, answer = await sign_in(anon, "/v1/sessions/link", {"code": later.body["code"]})
    assert answer.body["user"]["username"] == "owner"
    # A tenant admin's link signs in as that admin, in that tenant, without operator rights.
    api.service.clock = lambda: datetime.now(UTC)
    mine = await admin.post("/v1/sign-in-links", {})
    _, as_admin = await sign_in(anon, "/v1/sessions/link", {"code": mine.body["code"]})
    assert (as_admin.body["tenant"]["id"], as_admin.body["operator"]) == (tenant_id, False)


async def test_idle_and_old_sessions_end_by_themselves(api: RunningApi) -> None:
    owner = await _owner_session(api)
    assert (await owner.get("/v1/me")).status == 200
    idle_h = api.service.settings.session_idle_hours
    api.service.clock = lambda: datetime.now(UTC) + timedelta(hours=idle_h, minutes=1)
    idle = await owner.get("/v1/me")
    assert idle.status == 401
    assert "unused" in idle.body["message"]

    api.service.clock = lambda: datetime.now(UTC)
    fresh = await _owner_session_from_new_link(api)
    max_days = api.service.settings.session_max_days
    step = timedelta(hours=idle_h / 2)
    at = datetime.now(UTC)
    while at < datetime.now(UTC) + timedelta(days=max_days):  # used often, but too long ago
        at += step
        api.service.clock = lambda at=at: at  # type: ignore[misc]
        answer = await fresh.get("/v1/me")
        if answer.status == 401:
            break
    assert answer.status == 401
    assert "ended at" in answer.body["message"]


async def _owner_session_from_new_link(api: RunningApi) -> SessionClient:
    made = await api.owner.post("/v1/sign-in-links", {})
    signed_in, _ = await sign_in(api.client(None), "/v1/sessions/link", {"code": made.body["code"]})
    return signed_in


async def test_behind_a_tls_front_the_cookie_is_secure(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = Settings(
        nats_url=bus.url,
        database_url=sqlite_url,
        data_dir=data_dir,
        public_url="https://einsora.example",
    )
    async with running_api(settings) as api:
        path = api.service.owner_sign_in_path
        assert path is not None
        answer = await api.client(None).post(
            "/v1/sessions/link",
            {"code": link_code(path)},
            headers={"Origin": "https://einsora.example"},  # the page as the front serves it
        )
        assert answer.status == 201, answer.text
        assert answer.headers["Set-Cookie"].endswith("; Secure")
