"""Tenants, members and invitations: the operator makes tenants, admins invite, users join
themselves; nobody is ever handed a token for someone else (ADR-0008)."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.testing import RunningApi, new_tenant
from einsora.common.schemas import utcnow


async def test_operator_makes_tenants_and_admins_invite_members(api_on_store: RunningApi) -> None:
    api = api_on_store
    tenant_id, ann = await new_tenant(api, "physics", "ann")
    me = await ann.get("/v1/me")
    assert me.body["tenant"] == {"id": tenant_id, "name": "physics"}
    assert me.body["role"] == "admin"
    assert me.body["operator"] is False

    invited = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "bob"})
    assert invited.status == 201
    assert invited.body["role"] == "member"
    assert invited.body["existing_user"] is False
    assert "token" not in invited.body
    code = invited.body["code"]
    assert code.startswith("inv_")
    joined = await api.client(None).post("/v1/invitations/redeem", {"code": code})
    assert joined.status == 201
    assert joined.body["user"]["username"] == "bob"
    bob = api.client(joined.body["token"]["token"])
    assert (await bob.get("/v1/me")).body["role"] == "member"
    assert joined.body["token"]["operator"] is False

    # Bob makes his own token; Bob cannot invite nor make tenants.
    own = await bob.post("/v1/tokens", {"name": "bob's script"})
    assert own.status == 201
    assert (await api.client(own.body["token"]).get("/v1/me")).status == 200
    refused = await bob.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "eve"})
    assert refused.status == 403
    assert (await bob.get(f"/v1/tenants/{tenant_id}/invitations")).status == 403
    assert (await bob.post("/v1/tenants", {"name": "mine"})).status == 403
    assert (await ann.post("/v1/tenants", {"name": "mine"})).status == 403

    members = await ann.get(f"/v1/tenants/{tenant_id}/members")
    assert sorted(m["user"]["username"] for m in members.body["items"]) == ["ann", "bob"]
    assert [t["name"] for t in (await ann.get("/v1/tenants")).body["items"]] == ["physics"]
    everything = await api.owner.get("/v1/tenants")
    assert sorted(t["name"] for t in everything.body["items"]) == ["owner", "physics"]


async def test_a_tenant_admin_cannot_become_the_operator(api_on_store: RunningApi) -> None:
    """The probe's repro: B's admin adds `owner` to B and got a token acting as the operator."""
    api = api_on_store
    owner_tenant = (await api.owner.get("/v1/me")).body["tenant"]["id"]
    tb, b_admin = await new_tenant(api, "tenant-b", "mallory")

    invited = await b_admin.post(
        f"/v1/tenants/{tb}/invitations", {"username": "owner", "role": "admin"}
    )
    assert invited.status == 201
    assert invited.body["existing_user"] is True
    assert invited.body["code"] is None
    assert "token" not in invited.text
    assert "tsk_" not in invited.text
    # The old route that handed out the member's token is gone.
    old = await b_admin.post(f"/v1/tenants/{tb}/members", {"username": "owner", "role": "admin"})
    assert old.status == 405
    # Only the invited user may accept: not the admin who made the invitation.
    stolen = await b_admin.post(f"/v1/invitations/{invited.body['id']}/accept")
    assert stolen.status == 404
    assert (await b_admin.get("/v1/invitations")).body["items"] == []
    # Nothing the admin holds acts as the operator, or reaches tenant A.
    assert (await b_admin.get("/v1/me")).body["operator"] is False
    grab = await b_admin.post(
        f"/v1/tenants/{owner_tenant}/invitations", {"username": "mallory", "role": "admin"}
    )
    assert grab.status == 404
    assert (await b_admin.post("/v1/tokens", {"name": "op", "operator": True})).status == 403

    # The owner sees the invitation and accepts it; the token for B is the owner's own and
    # carries no operator rights, because operator rights never come through a tenant.
    mine = await api.owner.get("/v1/invitations")
    assert [i["id"] for i in mine.body["items"]] == [invited.body["id"]]
    joined = await api.owner.post(f"/v1/invitations/{invited.body['id']}/accept")
    assert joined.status == 201
    in_b = api.client(joined.body["token"]["token"])
    me_in_b = await in_b.get("/v1/me")
    assert me_in_b.body["tenant"]["id"] == tb
    assert me_in_b.body["user"]["username"] == "owner"
    assert me_in_b.body["operator"] is False
    assert (await in_b.post("/v1/tenants", {"name": "escalated"})).status == 403
    assert (await in_b.get(f"/v1/tenants/{owner_tenant}/members")).status == 404
    # Accepting is once.
    again = await api.owner.post(f"/v1/invitations/{invited.body['id']}/accept")
    assert again.status == 404
    # The operator's own token is still the operator's.
    assert (await api.owner.get("/v1/me")).body["operator"] is True
    members_a = await api.owner.get(f"/v1/tenants/{owner_tenant}/members")
    assert [m["user"]["username"] for m in members_a.body["items"]] == ["owner"]


async def test_only_an_operator_token_mints_operator_tokens(api: RunningApi) -> None:
    plain = await api.owner.post("/v1/tokens", {"name": "script"})
    assert plain.status == 201
    assert plain.body["operator"] is False
    script = api.client(plain.body["token"])
    assert (await script.get("/v1/me")).body["operator"] is False
    assert (await script.post("/v1/tenants", {"name": "nope"})).status == 403
    assert (await script.post("/v1/tokens", {"name": "up", "operator": True})).status == 403

    op = await api.owner.post("/v1/tokens", {"name": "second operator token", "operator": True})
    assert op.status == 201
    assert op.body["operator"] is True
    assert (await api.client(op.body["token"]).get("/v1/me")).body["operator"] is True
    listed = await api.owner.get("/v1/tokens")
    assert {t["name"]: t["operator"] for t in listed.body["items"]} == {
        "owner": True,
        "script": False,
        "second operator token": True,
    }


async def test_an_invitation_code_works_once(api: RunningApi) -> None:
    tenant_id, ann = await new_tenant(api, "chem", "ann")
    invited = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "cy"})
    code = invited.body["code"]
    anonymous = api.client(None)
    first, second = (
        await anonymous.post("/v1/invitations/redeem", {"code": code}),
        await anonymous.post("/v1/invitations/redeem", {"code": code}),
    )
    assert first.status == 201
    assert second.status == 404
    assert code not in second.text
    unknown = await anonymous.post("/v1/invitations/redeem", {"code": "inv_" + "x" * 43})
    assert unknown.status == 404
    assert unknown.body["request_id"] == unknown.request_id
    malformed = await anonymous.post("/v1/invitations/redeem", {"code": "tsk_nope"})
    assert malformed.status == 422
    assert malformed.body["details"][0]["field"] == "code"
    # The store keeps only the code's hash.
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        stored = (await conn.execute(sa.select(m.invitations))).all()
    assert code not in repr(stored)


async def test_revoked_and_expired_invitations_are_refused(api: RunningApi) -> None:
    tenant_id, ann = await new_tenant(api, "bio", "ann")
    revoked = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "dan"})
    gone = await ann.delete(f"/v1/tenants/{tenant_id}/invitations/{revoked.body['id']}")
    assert gone.status == 204
    refused = await api.client(None).post("/v1/invitations/redeem", {"code": revoked.body["code"]})
    assert refused.status == 404

    expiring = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "eli"})
    assert api.service.store is not None
    async with api.service.store.write() as conn:
        await conn.execute(
            sa.update(m.invitations)
            .where(m.invitations.c.id == expiring.body["id"])
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    late = await api.client(None).post("/v1/invitations/redeem", {"code": expiring.body["code"]})
    assert late.status == 404
    # A new invitation for the same username is possible once the last one is closed.
    again = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "eli"})
    assert again.status == 201


async def test_names_are_unique_and_members_join_once(api: RunningApi) -> None:
    tenant_id, ann = await new_tenant(api, "chem", "ann")
    taken = await api.owner.post("/v1/tenants", {"name": "chem"})
    assert taken.status == 409
    twice = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "ann"})
    assert twice.status == 409
    assert twice.body["error"] == "already_member"
    first = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "gus"})
    assert first.status == 201
    duplicate = await ann.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "gus"})
    assert duplicate.status == 409
    assert duplicate.body["error"] == "already_invited"

    # An existing user joins a second tenant by accepting, with a token of their own for it.
    other_id, bea = await new_tenant(api, "bio", "bea")
    invited = await bea.post(f"/v1/tenants/{other_id}/invitations", {"username": "ann"})
    assert invited.body["existing_user"] is True
    joined = await ann.post(f"/v1/invitations/{invited.body['id']}/accept")
    assert joined.status == 201
    second = api.client(joined.body["token"]["token"])
    me = await second.get("/v1/me")
    assert me.body["tenant"]["name"] == "bio"
    assert me.body["user"]["username"] == "ann"
    assert me.body["role"] == "member"
    # Her first token still acts in her first tenant only.
    assert (await ann.get("/v1/me")).body["tenant"]["name"] == "chem"


async def test_a_squatted_username_cannot_redeem(api: RunningApi) -> None:
    """A code for a new user stops working if that username is taken meanwhile."""
    t1, a1 = await new_tenant(api, "one", "ann")
    t2, a2 = await new_tenant(api, "two", "bo")
    first = await a1.post(f"/v1/tenants/{t1}/invitations", {"username": "zed"})
    second = await a2.post(f"/v1/tenants/{t2}/invitations", {"username": "zed"})
    assert first.body["code"]
    assert second.body["code"]
    ok = await api.client(None).post("/v1/invitations/redeem", {"code": first.body["code"]})
    assert ok.status == 201
    late = await api.client(None).post("/v1/invitations/redeem", {"code": second.body["code"]})
    assert late.status == 409
    assert late.body["error"] == "username_taken"
    zed = api.client(ok.body["token"]["token"])
    assert (await zed.get("/v1/me")).body["tenant"]["id"] == t1
    # Nothing was made by the refused redemption: zed is still in one tenant only.
    members_two = await a2.get(f"/v1/tenants/{t2}/members")
    assert [m["user"]["username"] for m in members_two.body["items"]] == ["bo"]


async def test_lists_page_with_cursors(api: RunningApi) -> None:
    for i in range(5):
        assert (await api.owner.post("/v1/tenants", {"name": f"t{i}"})).status == 201
    names: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = await api.owner.get("/v1/tenants", params=params)
        names.extend(t["name"] for t in page.body["items"])
        cursor = page.body["next_cursor"]
        if cursor is None:
            break
    assert sorted(names) == ["owner", "t0", "t1", "t2", "t3", "t4"]
    assert len(names) == 6
