"""Join tokens, the join exchange, a machine's own view, and revocation, against a real api."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from nats.js.errors import KeyNotFoundError

from einsora.api.testing import RunningApi, eventually, new_member, new_tenant
from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import Enrolment, utcnow
from einsora.common.testing import Bus

TOKENS = "/v1/machines/join-tokens"
HUB_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOv4EmEL3Zg0Cc9mJ2o7ULQp7yUh1m1Y5h+1yPzKD2Zx hub"
AGENT_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq3pPZ9GlgEd3Ow7zZ8X8XU6jT7qNcs1b6m2nJ9aXyE agent"


def _hub(api: RunningApi) -> None:
    """The tunnel hub's public key where the proxy would write it."""
    path: Path = api.service.settings.data_dir / "tunnel" / "hub_key.pub"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HUB_KEY + "\n")


async def _token(client: Any, **body: Any) -> dict[str, Any]:
    made = await client.post(TOKENS, body)
    assert made.status == 201, made.text
    return dict(made.body)


async def _join(api: RunningApi, token: str, **extra: Any) -> Any:
    body = {"token": token, "hostname": "box", "tunnel_key": AGENT_KEY, **extra}
    return await api.client(None).post("/v1/machines/join", body)


async def _enrolment(bus: Bus, machine_id: str) -> Enrolment | None:
    try:
        entry = await bind_bucket(bus.js, names.ENROLMENTS).get(names.enrolment_key(machine_id))
    except KeyNotFoundError:
        return None
    return None if entry.value is None else Enrolment.from_bytes(entry.value)


async def test_a_machine_joins_once_with_its_owner_region_and_sharing_from_the_token(
    api: RunningApi, bus: Bus
) -> None:
    _hub(api)
    tenant_id, admin = await new_tenant(api, "lab", "lab-admin")
    made = await _token(admin, region="office", sharing="community")
    assert made["token"].startswith("agt_")
    assert made["join_command"].endswith(f"--token {made['token']}")
    admin_id = (await admin.get("/v1/me")).body["user"]["id"]

    joined = await _join(api, made["token"])
    assert joined.status == 201, joined.text
    reply = joined.body
    assert reply["credential"].startswith("agk_")
    assert (reply["owner_tenant_id"], reply["region"], reply["sharing"]) == (
        tenant_id,
        "office",
        "community",
    )
    assert reply["tunnel"]["hub_key"] == HUB_KEY
    machine_id = reply["machine_id"]
    # The scheduler's and the hub's copy is on the bus before the agent has its credential.
    enrolment = await _enrolment(bus, machine_id)
    assert enrolment is not None
    assert (enrolment.owner_tenant_id, enrolment.owner_user_id) == (tenant_id, admin_id)
    assert (enrolment.region, enrolment.tunnel_key, enrolment.revoked) == (
        "office",
        AGENT_KEY,
        False,
    )

    # Single use: a second machine with the same token is refused, and nothing is enrolled.
    again = await _join(api, made["token"])
    assert again.status == 401
    assert again.body["error"] == "join_token_invalid"
    assert again.body["request_id"] == again.request_id
    listed = (await admin.get(TOKENS)).body["items"]
    assert [(t["id"], t["used"], t["uses"]) for t in listed] == [(made["id"], 1, 1)]
    assert "token" not in listed[0]

    # The machine's own view, by its credential; another one's credential is not it.
    me = await api.client(None).get(
        "/v1/machines/self", headers={"Authorization": f"Bearer {reply['credential']}"}
    )
    assert me.status == 200
    assert me.body["machine_id"] == machine_id
    bogus = await api.client(None).get(
        "/v1/machines/self", headers={"Authorization": "Bearer agk_" + "x" * 43}
    )
    assert bogus.status == 401
    assert bogus.body["error"] == "unauthenticated"

    shown = {m["id"]: m for m in (await admin.get("/v1/machines")).body["items"]}
    assert shown[machine_id]["region"] == "office"
    assert shown[machine_id]["enrolment"]["owner_tenant_id"] == tenant_id
    assert shown[machine_id]["enrolment"]["sharing"] == "community"


async def test_an_expired_or_revoked_token_is_refused_and_uses_are_counted(
    api: RunningApi,
) -> None:
    _hub(api)
    made = await _token(api.owner, uses=2, tunnel=False)
    first = await _join(api, made["token"], tunnel_key=None)
    second = await _join(api, made["token"], tunnel_key=None)
    third = await _join(api, made["token"], tunnel_key=None)
    assert [first.status, second.status, third.status] == [201, 201, 401]
    assert first.body["machine_id"] != second.body["machine_id"]
    assert first.body["tunnel"] is None

    expiring = await _token(api.owner, expires_in_hours=1)
    later = utcnow() + timedelta(hours=2)
    api.service.clock = lambda: later
    assert (await _join(api, expiring["token"])).status == 401
    api.service.clock = utcnow

    revoked = await _token(api.owner)
    assert (await api.owner.delete(f"{TOKENS}/{revoked['id']}")).status == 204
    assert (await _join(api, revoked["token"])).status == 401
    unknown = await _join(api, "agt_" + "y" * 43)
    assert unknown.status == 401
    # Unknown, used up, expired or revoked: one answer, so a stolen token tells nothing.
    assert unknown.body["message"] == third.body["message"]
    assert unknown.body["error"] == third.body["error"] == "join_token_invalid"


async def test_only_admins_and_the_operator_enrol_and_revoke(api: RunningApi) -> None:
    _hub(api)
    tenant_id, admin = await new_tenant(api, "lab", "lab-admin")
    member = await new_member(api, tenant_id, "alice", by=admin)
    refused = await member.post(TOKENS, {})
    assert refused.status == 403
    machine = (await _join(api, (await _token(admin))["token"])).body["machine_id"]
    assert (await member.delete(f"/v1/machines/{machine}")).status == 403
    _, other_admin = await new_tenant(api, "other", "other-admin")
    assert (await other_admin.delete(f"/v1/machines/{machine}")).status == 404
    assert (await api.owner.delete("/v1/machines/m-nope")).status == 404


async def test_revocation_marks_the_machine_and_refuses_its_credential(
    api: RunningApi, bus: Bus
) -> None:
    _hub(api)
    _, admin = await new_tenant(api, "lab", "lab-admin")
    reply = (await _join(api, (await _token(admin))["token"])).body
    machine_id, credential = reply["machine_id"], reply["credential"]

    gone = await admin.delete(f"/v1/machines/{machine_id}")
    assert gone.status == 204
    enrolment = await _enrolment(bus, machine_id)
    assert enrolment is not None
    assert enrolment.revoked
    me = await api.client(None).get(
        "/v1/machines/self", headers={"Authorization": f"Bearer {credential}"}
    )
    assert me.status == 401
    assert me.body["error"] == "machine_revoked"
    assert (await admin.delete(f"/v1/machines/{machine_id}")).status == 204  # idempotent
    shown = {m["id"]: m for m in (await admin.get("/v1/machines")).body["items"]}
    assert shown[machine_id]["enrolment"]["revoked_at"] is not None
    assert shown[machine_id]["region"] is None


async def test_a_tunnelled_join_needs_a_hub_and_a_key(api: RunningApi) -> None:
    made = await _token(api.owner, uses=3)
    no_hub = await _join(api, made["token"])
    assert no_hub.status == 503
    assert "tunnel hub" in no_hub.body["message"]
    _hub(api)
    no_key = await _join(api, made["token"], tunnel_key=None)
    assert no_key.status == 422
    assert (await _join(api, made["token"])).status == 201  # the refusals used nothing up
    listed = (await api.owner.get(TOKENS)).body["items"]
    assert listed[0]["used"] == 1


async def test_the_enrolments_bucket_is_repaired_from_the_store(api: RunningApi, bus: Bus) -> None:
    _hub(api)
    reply = (await _join(api, (await _token(api.owner))["token"])).body
    kv = bind_bucket(bus.js, names.ENROLMENTS)
    await kv.delete(names.enrolment_key(reply["machine_id"]))
    stray = Enrolment(machine_id="m-stray", owner_tenant_id="t-x", region="local")
    await kv.put("m-stray", stray.to_bytes())
    sync = api.service.enrolments
    assert sync is not None
    put, deleted = await sync.repair()
    assert (put, deleted) == ((reply["machine_id"],), ("m-stray",))

    async def back() -> bool:
        return await _enrolment(bus, reply["machine_id"]) is not None

    await eventually(back)
