"""Tenants and members: the operator makes tenants, admins add members, members make tokens."""

from __future__ import annotations

from einsora.api.testing import Client, RunningApi


async def _tenant_with_admin(api: RunningApi, name: str, admin: str) -> tuple[str, Client]:
    tenant = await api.owner.post("/v1/tenants", {"name": name})
    assert tenant.status == 201
    member = await api.owner.post(
        f"/v1/tenants/{tenant.body['id']}/members", {"username": admin, "role": "admin"}
    )
    assert member.status == 201
    return tenant.body["id"], api.client(member.body["token"]["token"])


async def test_operator_makes_tenants_and_admins_add_members(api_on_store: RunningApi) -> None:
    api = api_on_store
    tenant_id, ann = await _tenant_with_admin(api, "physics", "ann")
    me = await ann.get("/v1/me")
    assert me.body["tenant"] == {"id": tenant_id, "name": "physics"}
    assert me.body["role"] == "admin"
    assert me.body["operator"] is False

    added = await ann.post(f"/v1/tenants/{tenant_id}/members", {"username": "bob"})
    assert added.status == 201
    assert added.body["role"] == "member"
    assert added.body["user"]["username"] == "bob"
    bob = api.client(added.body["token"]["token"])
    assert (await bob.get("/v1/me")).body["role"] == "member"

    # Bob makes his own token; Bob cannot add members nor make tenants.
    own = await bob.post("/v1/tokens", {"name": "bob's script"})
    assert own.status == 201
    assert (await api.client(own.body["token"]).get("/v1/me")).status == 200
    refused = await bob.post(f"/v1/tenants/{tenant_id}/members", {"username": "eve"})
    assert refused.status == 403
    assert (await bob.post("/v1/tenants", {"name": "mine"})).status == 403
    assert (await ann.post("/v1/tenants", {"name": "mine"})).status == 403

    members = await ann.get(f"/v1/tenants/{tenant_id}/members")
    assert sorted(m["user"]["username"] for m in members.body["items"]) == ["ann", "bob"]
    assert [t["name"] for t in (await ann.get("/v1/tenants")).body["items"]] == ["physics"]
    everything = await api.owner.get("/v1/tenants")
    assert sorted(t["name"] for t in everything.body["items"]) == ["owner", "physics"]


async def test_names_are_unique_and_members_join_once(api: RunningApi) -> None:
    tenant_id, ann = await _tenant_with_admin(api, "chem", "ann")
    taken = await api.owner.post("/v1/tenants", {"name": "chem"})
    assert taken.status == 409
    twice = await ann.post(f"/v1/tenants/{tenant_id}/members", {"username": "ann"})
    assert twice.status == 409
    # An existing user joins a second tenant with a token for that tenant.
    other_id, _ = await _tenant_with_admin(api, "bio", "bea")
    joined = await api.owner.post(f"/v1/tenants/{other_id}/members", {"username": "ann"})
    assert joined.status == 201
    second = api.client(joined.body["token"]["token"])
    me = await second.get("/v1/me")
    assert me.body["tenant"]["name"] == "bio"
    assert me.body["user"]["username"] == "ann"
    assert me.body["role"] == "member"


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
