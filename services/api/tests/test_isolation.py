"""Tenant isolation: another tenant's workload, token or tenant answers 404 on every route, and
never shows up in a list. The table below must name every route with an id in its path."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from fastapi.routing import APIRoute

from einsora.api.routers import ROUTERS
from einsora.api.testing import Client, RunningApi, new_member, new_tenant


@dataclass
class Victim:
    tenant_id: str
    workload_id: str
    parked_id: str
    token_id: str
    invitation_id: str
    gateway_key_id: str
    join_token_id: str
    machine_id: str
    machine_invitation_id: str
    client: Client


ATTEMPTS: list[tuple[str, str, str, object]] = [
    # method, route template, which of the victim's ids, body
    ("GET", "/v1/workloads/{id}", "workload_id", None),
    ("POST", "/v1/workloads/{id}/park", "workload_id", None),
    ("POST", "/v1/workloads/{id}/resume", "parked_id", None),
    ("DELETE", "/v1/workloads/{id}", "workload_id", None),
    ("GET", "/v1/workloads/{id}/events", "workload_id", None),
    ("GET", "/v1/workloads/{id}/export", "workload_id", None),
    ("POST", "/v1/workloads/{id}/access", "workload_id", None),
    ("DELETE", "/v1/tokens/{id}", "token_id", None),
    ("POST", "/v1/tenants/{id}/invitations", "tenant_id", {"username": "mallory", "role": "admin"}),
    ("GET", "/v1/tenants/{id}/invitations", "tenant_id", None),
    ("DELETE", "/v1/tenants/{id}/invitations/{invitation}", "tenant_id", None),
    ("GET", "/v1/tenants/{id}/members", "tenant_id", None),
    ("PATCH", "/v1/tenants/{id}/members/{user}", "tenant_id", {"role": "member"}),
    ("DELETE", "/v1/tenants/{id}/members/{user}", "tenant_id", None),
    ("DELETE", "/v1/tenants/{id}/members/{user}/credentials", "tenant_id", None),
    ("GET", "/v1/tenants/{id}/limits", "tenant_id", None),
    ("PUT", "/v1/tenants/{id}/limits", "tenant_id", {"max_workloads": 1}),
    ("GET", "/v1/tenants/{id}/quota", "tenant_id", None),
    ("PUT", "/v1/tenants/{id}/quota", "tenant_id", {"max_gpus_total": 1}),
    ("POST", "/v1/invitations/{id}/accept", "invitation_id", None),
    ("GET", "/v1/gateway/keys/{id}", "gateway_key_id", None),
    ("DELETE", "/v1/gateway/keys/{id}", "gateway_key_id", None),
    ("DELETE", "/v1/machines/join-tokens/{id}", "join_token_id", None),
    ("GET", "/v1/machines/{id}", "machine_id", None),
    ("DELETE", "/v1/machines/{id}", "machine_id", None),
    ("PATCH", "/v1/machines/{id}", "machine_id", {"sharing": "community"}),
    ("POST", "/v1/machines/{id}/invitations", "machine_id", {"tenant": "intruder"}),
    ("GET", "/v1/machines/{id}/invitations", "machine_id", None),
    ("DELETE", "/v1/machines/{id}/invitations/{invitation}", "machine_id", None),
    ("POST", "/v1/machines/{id}/reclaim", "machine_id", None),
    ("POST", "/v1/machines/{id}/release", "machine_id", None),
    ("POST", "/v1/machine-invitations/{id}/accept", "machine_invitation_id", None),
]


def test_the_table_covers_every_route_with_an_id() -> None:
    routes = [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]
    with_ids = {(m, r.path_format) for r in routes if "{" in r.path for m in r.methods or ()}
    assert with_ids == {(method, path) for method, path, _, _ in ATTEMPTS}


async def _tenant(api: RunningApi, name: str) -> tuple[str, Client]:
    return await new_tenant(api, name, f"{name}-admin")


async def _victim(api: RunningApi) -> Victim:
    tenant_id, client = await _tenant(api, "victim")
    running = await client.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    parked = await client.post("/v1/workloads", {"kind": "vm", "class": "cpu-2c-4g"})
    token = await client.post("/v1/tokens", {"name": "victim's"})
    gateway_key = await client.post("/v1/gateway/keys", {"name": "victim's"})
    # An open invitation of the victim's tenant, to an existing user who is not the intruder.
    invitation = await client.post(f"/v1/tenants/{tenant_id}/invitations", {"username": "owner"})
    # A join token, and a machine enrolled with another one.
    join_token = await client.post("/v1/machines/join-tokens", {"tunnel": False})
    spent = await client.post("/v1/machines/join-tokens", {"tunnel": False})
    machine = await api.client(None).post(
        "/v1/machines/join", {"token": spent.body["token"], "hostname": "victim's"}
    )
    # An open invitation to use the machine, of a third tenant (the intruder is not it).
    await _tenant(api, "guest")
    machine_invitation = await client.post(
        f"/v1/machines/{machine.body['machine_id']}/invitations", {"tenant": "guest"}
    )
    assert api.service.store is not None
    async with api.service.store.write() as conn:  # so every action would be allowed
        for wid, state in ((running.body["id"], "running"), (parked.body["id"], "parked")):
            await conn.execute(
                sa.text("UPDATE workloads SET state = :s WHERE id = :id"), {"s": state, "id": wid}
            )
    return Victim(
        tenant_id,
        running.body["id"],
        parked.body["id"],
        token.body["id"],
        invitation.body["id"],
        gateway_key.body["id"],
        join_token.body["id"],
        machine.body["machine_id"],
        machine_invitation.body["id"],
        client,
    )


async def test_another_tenants_objects_answer_404_on_every_route(api_on_store: RunningApi) -> None:
    api = api_on_store
    victim = await _victim(api)
    _, intruder = await _tenant(api, "intruder")
    before = await victim.client.get(f"/v1/workloads/{victim.workload_id}/events")
    for method, template, which, body in ATTEMPTS:
        path = template.replace("{id}", getattr(victim, which))
        invitation = victim.machine_invitation_id if "/machines/" in template else None
        path = path.replace("{invitation}", invitation or victim.invitation_id)
        path = path.replace("{user}", "victim-admin")
        answer = await intruder.call(method, path, body)
        assert answer.status == 404, (method, template, answer.status, answer.text)
        assert answer.body["error"] == "not_found"
        assert getattr(victim, which) not in str(answer.body["details"])
    # Nothing changed for the victim.
    assert (await victim.client.get(f"/v1/workloads/{victim.workload_id}")).body[
        "state"
    ] == "running"
    assert (await victim.client.get(f"/v1/workloads/{victim.parked_id}")).body["state"] == "parked"
    after = await victim.client.get(f"/v1/workloads/{victim.workload_id}/events")
    assert after.body == before.body
    members = await victim.client.get(f"/v1/tenants/{victim.tenant_id}/members")
    assert [m["user"]["username"] for m in members.body["items"]] == ["victim-admin"]
    tokens = await victim.client.get("/v1/tokens")
    assert victim.token_id in [t["id"] for t in tokens.body["items"]]
    invitations = await victim.client.get(f"/v1/tenants/{victim.tenant_id}/invitations")
    still_open = [
        i["id"]
        for i in invitations.body["items"]
        if i["accepted_at"] is None and i["revoked_at"] is None
    ]
    assert still_open == [victim.invitation_id]
    join_tokens = await victim.client.get("/v1/machines/join-tokens")
    assert victim.join_token_id in [t["id"] for t in join_tokens.body["items"]]
    machines = {m["id"]: m for m in (await victim.client.get("/v1/machines")).body["items"]}
    assert machines[victim.machine_id]["enrolment"]["revoked_at"] is None
    assert machines[victim.machine_id]["enrolment"]["sharing"] == "private"
    path = f"/v1/machines/{victim.machine_id}/invitations"
    machine_invitations = (await victim.client.get(path)).body["items"]
    assert [(i["id"], i["accepted_at"], i["revoked_at"]) for i in machine_invitations] == [
        (victim.machine_invitation_id, None, None)
    ]


async def test_lists_show_only_the_callers_tenant(api: RunningApi) -> None:
    victim = await _victim(api)
    _, intruder = await _tenant(api, "intruder")
    mine = await intruder.post("/v1/workloads", {"kind": "endpoint", "class": "cpu-1c-2g"})
    listed = await intruder.get("/v1/workloads")
    assert [w["id"] for w in listed.body["items"]] == [mine.body["id"]]
    for state in ("running", "parked"):
        assert (await intruder.get("/v1/workloads", state=state)).body["items"] == []
    tokens = await intruder.get("/v1/tokens")
    assert victim.token_id not in tokens.text
    tenants = await intruder.get("/v1/tenants")
    assert [t["name"] for t in tenants.body["items"]] == ["intruder"]
    assert victim.tenant_id not in tenants.text
    # The victim's private machine is not listed (nor its invitation, to another tenant).
    assert victim.machine_id not in (await intruder.get("/v1/machines")).text
    assert (await intruder.get("/v1/machine-invitations")).body["items"] == []


async def test_a_member_of_the_same_tenant_cannot_revoke_anothers_token(api: RunningApi) -> None:
    tenant_id, admin = await _tenant(api, "shared")
    carl = await new_member(api, tenant_id, "carl", by=admin)
    admins = await admin.post("/v1/tokens", {"name": "admin's"})
    assert (await carl.delete(f"/v1/tokens/{admins.body['id']}")).status == 404
    assert (await api.client(admins.body["token"]).get("/v1/me")).status == 200
