"""Offboarding a tenant's member (issue 34, N11), against real api replicas, bus and store.

A tenant's admins (and the operator) remove a member, change a member's role, or revoke a
member's credentials; each takes effect on every api replica within a second (the revocations
on the bus), is in the activity log, and leaves the member's workloads to the tenant. A member
may do none of it (403), another tenant's admin gets 404, and a tenant never loses its last
admin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.testing import (
    Client,
    RunningApi,
    eventually,
    new_member,
    new_tenant,
    running_api,
    sign_in,
)
from einsora.common.settings import Settings
from einsora.common.testing import Bus

PASSWORD = "correct horse battery staple"


async def _refused_within_a_second(client: Client, what: str) -> None:
    async def refused() -> bool:
        return (await client.get("/v1/me")).status == 401

    await eventually(refused, within_s=1.0, what=what)


async def _activity(api: RunningApi, action: str) -> list[dict[str, Any]]:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        rows = await conn.execute(
            sa.text("SELECT * FROM activity WHERE action = :a ORDER BY seq"), {"a": action}
        )
        return [dict(r) for r in rows.mappings().all()]


@pytest.fixture
def settings(bus: Bus, sqlite_url: str, data_dir: Path) -> Settings:
    return Settings(nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir)


async def test_a_removed_member_is_refused_on_every_replica_within_a_second(
    settings: Settings,
) -> None:
    async with running_api(settings) as first, running_api(settings) as second:
        acme, admin = await new_tenant(first, "acme", "ann")
        carl = await new_member(first, acme, "carl")
        assert carl.token is not None
        launched = await carl.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
        assert launched.status == 201, launched.text
        key = await carl.post("/v1/gateway/keys", {"name": "carl's app"})
        assert key.status == 201, key.text
        assert (await carl.call("PUT", "/v1/me/password", {"password": PASSWORD})).status == 204
        carl_in_browser, _ = await sign_in(
            second.client(None), "/v1/sessions", {"username": "carl", "password": PASSWORD}
        )
        carl_id = (await carl.get("/v1/me")).body["user"]["id"]
        on_second = second.client(carl.token)
        for client in (on_second, carl_in_browser):
            assert (await client.get("/v1/me")).status == 200  # verified, and cached there

        removed = await admin.delete(f"/v1/tenants/{acme}/members/carl")
        assert removed.status == 200, removed.text
        assert removed.body["user"]["username"] == "carl"
        assert (removed.body["api_tokens"], removed.body["sessions"]) == (1, 1)
        assert removed.body["gateway_keys"] == 1
        assert (await carl.get("/v1/me")).status == 401  # at once on the replica that removed
        await _refused_within_a_second(on_second, "carl's token on the other replica")
        await _refused_within_a_second(carl_in_browser, "carl's session on the other replica")

        members = await admin.get(f"/v1/tenants/{acme}/members")
        assert [m["user"]["username"] for m in members.body["items"]] == ["ann"]
        keys = await admin.get("/v1/gateway/keys")
        assert key.body["id"] not in [k["id"] for k in keys.body["items"]]
        # The workloads stay, the tenant's.
        kept = await admin.get(f"/v1/workloads/{launched.body['id']}")
        assert kept.status == 200
        assert kept.body["state"] not in ("removing", "removed")
        [row] = await _activity(first, "member.remove")
        assert (row["tenant_id"], row["target"], row["status"]) == (acme, "carl", 200)
        # Revoked for good, not only while the membership is gone: inviting carl back later
        # brings none of them back.
        assert first.service.store is not None
        async with first.service.store.read() as conn:
            live = await conn.scalar(
                sa.select(sa.func.count())
                .select_from(m.api_tokens)
                .where(m.api_tokens.c.user_id == carl_id, m.api_tokens.c.revoked_at.is_(None))
            )
        assert live == 0


async def test_a_role_change_holds_on_every_replica_within_a_second(settings: Settings) -> None:
    async with running_api(settings) as first, running_api(settings) as second:
        acme, admin = await new_tenant(first, "acme", "ann")
        carl = await new_member(first, acme, "carl")
        carl_there = second.client(carl.token)
        invite = {"username": "dora"}
        refused = await carl_there.post(f"/v1/tenants/{acme}/invitations", invite)
        assert refused.status == 403  # a member; now cached as one on the second replica

        changed = await admin.call("PATCH", f"/v1/tenants/{acme}/members/carl", {"role": "admin"})
        assert changed.status == 200, changed.text
        assert changed.body["role"] == "admin"

        async def an_admin_there() -> bool:
            role: str = (await carl_there.get("/v1/me")).body["role"]
            return role == "admin"

        await eventually(an_admin_there, within_s=1.0, what="carl an admin on the other replica")
        assert (await carl_there.post(f"/v1/tenants/{acme}/invitations", invite)).status == 201

        back = await carl.call("PATCH", f"/v1/tenants/{acme}/members/ann", {"role": "member"})
        assert back.status == 200, back.text
        ann_there = second.client(admin.token)

        async def a_member_there() -> bool:
            role: str = (await ann_there.get("/v1/me")).body["role"]
            return role == "member"

        await eventually(a_member_there, within_s=1.0, what="ann a member on the other replica")
        rows = await _activity(first, "member.role.set")
        assert [(r["target"], r["outcome"]) for r in rows] == [("carl", "ok"), ("ann", "ok")]


async def test_revoking_a_members_credentials_keeps_the_membership(settings: Settings) -> None:
    async with running_api(settings) as first, running_api(settings) as second:
        acme, admin = await new_tenant(first, "acme", "ann")
        carl = await new_member(first, acme, "carl")
        spare = await carl.post("/v1/tokens", {"name": "laptop"})
        laptop = second.client(spare.body["token"])
        assert (await laptop.get("/v1/me")).status == 200
        me = (await carl.get("/v1/me")).body["user"]

        revoked = await admin.delete(f"/v1/tenants/{acme}/members/{me['id']}/credentials")
        assert revoked.status == 200, revoked.text
        assert revoked.body["api_tokens"] == 2
        await _refused_within_a_second(laptop, "carl's laptop token on the other replica")
        assert (await carl.get("/v1/me")).status == 401
        members = await admin.get(f"/v1/tenants/{acme}/members")
        assert sorted(m["user"]["username"] for m in members.body["items"]) == ["ann", "carl"]


async def test_only_admins_and_the_operator_offboard_and_never_the_last_admin(
    api: RunningApi,
) -> None:
    acme, admin = await new_tenant(api, "acme", "ann")
    carl = await new_member(api, acme, "carl")
    dora = await new_member(api, acme, "dora")
    other, intruder = await new_tenant(api, "other", "mallory")

    for method, path, body in (
        ("DELETE", f"/v1/tenants/{acme}/members/dora", None),
        ("PATCH", f"/v1/tenants/{acme}/members/carl", {"role": "admin"}),
        ("DELETE", f"/v1/tenants/{acme}/members/dora/credentials", None),
    ):
        as_member = await carl.call(method, path, body)
        assert as_member.status == 403, (path, as_member.text)
        assert as_member.body["request_id"] == as_member.request_id
        elsewhere = await intruder.call(method, path, body)
        assert elsewhere.status == 404, (path, elsewhere.text)
        assert elsewhere.body["error"] == "not_found"
    assert (await dora.get("/v1/me")).status == 200

    nobody = await admin.delete(f"/v1/tenants/{acme}/members/mallory")
    assert nobody.status == 404  # not a member of this tenant
    bad_role = await admin.call("PATCH", f"/v1/tenants/{acme}/members/carl", {"role": "owner"})
    assert bad_role.status == 422
    assert bad_role.body["details"][0]["field"] == "role"
    last = await admin.delete(f"/v1/tenants/{acme}/members/ann")
    assert last.status == 409, last.text
    assert last.body["error"] == "last_admin"
    demoted = await admin.call("PATCH", f"/v1/tenants/{acme}/members/ann", {"role": "member"})
    assert demoted.status == 409
    assert (await admin.get("/v1/me")).body["role"] == "admin"

    # The operator may, in any tenant; and a tenant's admin may not touch the operator.
    by_operator = await api.owner.delete(f"/v1/tenants/{acme}/members/dora")
    assert by_operator.status == 200, by_operator.text
    invited = await intruder.post(f"/v1/tenants/{other}/invitations", {"username": "owner"})
    accepted = await api.owner.post(f"/v1/invitations/{invited.body['id']}/accept")
    assert accepted.status == 201
    refused = await intruder.delete(f"/v1/tenants/{other}/members/owner")
    assert refused.status == 403, refused.text
    assert (await api.owner.get("/v1/me")).status == 200
