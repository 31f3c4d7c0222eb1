"""Sharing machines against a real api and a real bus: the sharing level, machine invitations
and guests in the `enrolments` bucket, who sees which machine, and the host note."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
import sqlalchemy as sa

from einsora.api.testing import (
    Client,
    RunningApi,
    enrolment_on_bus,
    eventually,
    join_machine,
    new_member,
    new_tenant,
    running_api,
)
from einsora.common.bus import bind_bucket, names
from einsora.common.settings import Settings
from einsora.common.testing import Bus


@pytest_asyncio.fixture
async def pool_api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api of an instance that runs a community pool."""
    settings = Settings(
        nats_url=bus.url,
        database_url=sqlite_url,
        data_dir=data_dir,
        community_pool=True,
        direct_machine_networks="127.0.0.0/8",  # its machines join from this host
    )
    async with running_api(settings) as running:
        yield running


async def _share(client: Client, machine_id: str, body: Any) -> Any:
    return await client.call("PATCH", f"/v1/machines/{machine_id}", body)


async def _invite(client: Client, machine_id: str, tenant: str) -> Any:
    return await client.post(f"/v1/machines/{machine_id}/invitations", {"tenant": tenant})


async def _accept(client: Client, invitation_id: str) -> Any:
    return await client.post(f"/v1/machine-invitations/{invitation_id}/accept")


async def test_the_owners_admin_sets_the_sharing_level_and_the_bucket_follows(
    pool_api: RunningApi, bus: Bus
) -> None:
    api = pool_api
    lab_id, lab = await new_tenant(api, "lab", "lab-admin")
    member = await new_member(api, lab_id, "lab-member", by=lab)
    _, other = await new_tenant(api, "other", "other-admin")
    machine = await join_machine(api, lab)

    shared = await _share(lab, machine, {"sharing": "invite-only"})
    assert shared.status == 200, shared.text
    assert shared.body["id"] == machine
    assert shared.body["enrolment"]["sharing"] == "invite-only"
    assert shared.body["enrolment"]["owner_tenant_name"] == "lab"
    assert shared.body["enrolment"]["guests"] == []
    # The scheduler's copy changed before the answer came.
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert enrolment.sharing == "invite-only"

    refused = await _share(member, machine, {"sharing": "community"})
    assert refused.status == 403, refused.text
    assert refused.body["request_id"] == refused.request_id
    stranger = await _share(other, machine, {"sharing": "community"})
    assert stranger.status == 404  # a private or invite-only machine is not told to strangers
    assert machine not in str(stranger.body["details"])
    assert (await _share(lab, "m-nope", {"sharing": "community"})).status == 404
    by_operator = await _share(api.owner, machine, {"sharing": "community"})
    assert by_operator.status == 200
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert enrolment.sharing == "community"
    # Now any tenant of the pool sees it, so another tenant's admin is refused, not told it is
    # absent.
    assert (await _share(other, machine, {"sharing": "private"})).status == 403

    for bad, field in (
        ({"sharing": "public"}, "sharing"),
        ({"sharing": "private", "owner": "me"}, "owner"),
        ({}, "sharing"),
        ({"sharing": 1}, "sharing"),
    ):
        answer = await _share(lab, machine, bad)
        assert answer.status == 422, (bad, answer.text)
        assert answer.body["error"] == "validation_error"
        assert answer.body["request_id"] == answer.request_id
        assert field in [d["field"] for d in answer.body["details"]], answer.body
    not_json = await lab.call("PATCH", f"/v1/machines/{machine}", data=b"{sharing")
    assert not_json.status == 400
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert enrolment.sharing == "community"  # nothing refused changed anything


async def test_an_accepted_invitation_makes_a_guest_until_it_is_revoked(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    _, lab = await new_tenant(api, "lab", "lab-admin")
    studio_id, studio = await new_tenant(api, "studio", "studio-admin")
    studio_member = await new_member(api, studio_id, "studio-member", by=studio)
    _, stranger = await new_tenant(api, "stranger", "stranger-admin")
    machine = await join_machine(api, lab, sharing="invite-only")

    made = await _invite(lab, machine, "studio")
    assert made.status == 201, made.text
    invitation = made.body
    assert invitation["id"].startswith("mi-")
    assert (invitation["machine_id"], invitation["tenant_id"], invitation["tenant_name"]) == (
        machine,
        studio_id,
        "studio",
    )
    assert (invitation["accepted_at"], invitation["revoked_at"]) == (None, None)
    # The same tenant again, by name or by id: the live invitation, not a second one.
    for tenant in ("studio", studio_id):
        again = await _invite(lab, machine, tenant)
        assert again.status == 200, again.text
        assert again.body["id"] == invitation["id"]
    for tenant, said in (("lab", "owner tenant"), ("nobody", "no tenant")):
        refused = await _invite(lab, machine, tenant)
        assert refused.status == 422, refused.text
        assert [d["field"] for d in refused.body["details"]] == ["tenant"]
        assert said in refused.body["message"]
        assert refused.body["request_id"] == refused.request_id
    for bad in ({"tenant": 5}, {"tenant": "studio", "role": "admin"}, {"tenant": ""}):
        assert (await lab.post(f"/v1/machines/{machine}/invitations", bad)).status == 422

    # The guest side: any member sees it; only an admin accepts; another tenant sees nothing.
    seen = await studio_member.get("/v1/machine-invitations")
    assert [i["id"] for i in seen.body["items"]] == [invitation["id"]]
    assert seen.body["items"][0]["owner_tenant_name"] == "lab"
    assert (await _accept(studio_member, invitation["id"])).status == 403
    assert (await stranger.get("/v1/machine-invitations")).body["items"] == []
    not_theirs = await _accept(stranger, invitation["id"])
    assert not_theirs.status == 404
    assert (await _accept(stranger, "mi-nope")).status == 404
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert enrolment.guests == []  # nothing refused changed anything

    accepted = await _accept(studio, invitation["id"])
    assert accepted.status == 200, accepted.text
    assert accepted.body["accepted_at"] is not None
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert enrolment.guests == [studio_id]  # on the bus before the answer
    assert (await _accept(studio, invitation["id"])).body["accepted_at"] == accepted.body[
        "accepted_at"
    ]
    owners = await lab.get(f"/v1/machines/{machine}/invitations")
    assert [(i["id"], i["accepted_at"]) for i in owners.body["items"]] == [
        (invitation["id"], accepted.body["accepted_at"])
    ]
    # A guest uses the machine but does not share it, nor see who else may.
    assert (await _share(studio, machine, {"sharing": "community"})).status == 403
    assert (await studio.get(f"/v1/machines/{machine}/invitations")).status == 403
    assert (await stranger.get(f"/v1/machines/{machine}/invitations")).status == 404
    assert (await _invite(studio, machine, "stranger")).status == 403

    gone = await lab.delete(f"/v1/machines/{machine}/invitations/{invitation['id']}")
    assert gone.status == 204
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert enrolment.guests == []
    assert (await lab.delete(f"/v1/machines/{machine}/invitations/{invitation['id']}")).status == (
        204
    )
    assert (await lab.delete(f"/v1/machines/{machine}/invitations/mi-nope")).status == 404
    assert (await studio.get("/v1/machine-invitations")).body["items"] == []
    assert (await _accept(studio, invitation["id"])).status == 404
    # Revoked, the tenant may be invited afresh.
    anew = await _invite(lab, machine, "studio")
    assert anew.status == 201
    assert anew.body["id"] != invitation["id"]


async def test_concurrent_invitations_of_one_tenant_make_one(api_on_store: RunningApi) -> None:
    api = api_on_store
    _, lab = await new_tenant(api, "lab", "lab-admin")
    await new_tenant(api, "studio", "studio-admin")
    machine = await join_machine(api, lab, sharing="invite-only")
    answers = await asyncio.gather(*(_invite(lab, machine, "studio") for _ in range(8)))
    assert sorted(a.status for a in answers) == [200] * 7 + [201], [a.text for a in answers]
    assert len({a.body["id"] for a in answers}) == 1
    listed = await lab.get(f"/v1/machines/{machine}/invitations")
    assert len(listed.body["items"]) == 1


async def test_the_repair_pass_puts_the_guests_back(api: RunningApi, bus: Bus) -> None:
    _, lab = await new_tenant(api, "lab", "lab-admin")
    studio_id, studio = await new_tenant(api, "studio", "studio-admin")
    machine = await join_machine(api, lab, sharing="invite-only")
    invitation = (await _invite(lab, machine, "studio")).body["id"]
    assert (await _accept(studio, invitation)).status == 200

    await bind_bucket(bus.js, names.ENROLMENTS).delete(names.enrolment_key(machine))
    sync = api.service.enrolments
    assert sync is not None
    put, _ = await sync.repair()
    assert put == (machine,)
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert (enrolment.sharing, enrolment.guests) == ("invite-only", [studio_id])
    assert await sync.repair() == ((), ())  # the store and the bucket agree now


async def _listed(client: Client) -> dict[str, Any]:
    return {m["id"]: m for m in (await client.get("/v1/machines")).body["items"]}


async def test_a_tenant_sees_its_machines_those_it_is_a_guest_of_and_the_community(
    pool_api: RunningApi,
) -> None:
    api = pool_api
    lab_id, lab = await new_tenant(api, "lab", "lab-admin")
    studio_id, studio = await new_tenant(api, "studio", "studio-admin")
    _, stranger = await new_tenant(api, "stranger", "stranger-admin")
    private = await join_machine(api, lab)
    invited = await join_machine(api, lab, sharing="invite-only")
    community = await join_machine(api, lab, sharing="community")
    # An accepted invitation to a private machine: the guest sees it once it is shared.
    held_back = await join_machine(api, lab)
    for machine in (invited, held_back):
        made = await _invite(lab, machine, "studio")
        assert (await _accept(studio, made.body["id"])).status == 200
    studios = await join_machine(api, studio)
    everyone = {private, invited, community, held_back, studios}

    async def caught_up() -> bool:
        listed = await _listed(api.owner)
        return everyone <= set(listed) and listed[invited]["enrolment"]["guests"] == [studio_id]

    await eventually(caught_up)
    assert set(await _listed(lab)) == {private, invited, community, held_back}
    owned = (await _listed(lab))[invited]["enrolment"]
    assert (owned["owner_tenant_id"], owned["guests"]) == (lab_id, [studio_id])
    assert set(await _listed(stranger)) == {community}

    guest_view = await _listed(studio)
    assert set(guest_view) == {invited, community, studios}
    shown = guest_view[invited]["enrolment"]
    assert (shown["owner_tenant_name"], shown["sharing"]) == ("lab", "invite-only")
    # The owner's ids and the other guests are the owner's business.
    assert (shown["guests"], shown["owner_tenant_id"], shown["owner_user_id"]) == (None,) * 3
    assert guest_view[studios]["enrolment"]["guests"] == []

    assert (await _share(lab, held_back, {"sharing": "invite-only"})).status == 200

    async def shared_now() -> bool:
        return held_back in await _listed(studio)

    await eventually(shared_now)
    assert (await _share(lab, community, {"sharing": "private"})).status == 200

    async def private_now() -> bool:
        return community not in await _listed(stranger)

    await eventually(private_now)


async def test_without_a_community_pool_community_counts_as_invite_only(api: RunningApi) -> None:
    _, lab = await new_tenant(api, "lab", "lab-admin")
    _, studio = await new_tenant(api, "studio", "studio-admin")
    _, stranger = await new_tenant(api, "stranger", "stranger-admin")
    machine = await join_machine(api, lab, sharing="community")
    made = await _invite(lab, machine, "studio")
    assert (await _accept(studio, made.body["id"])).status == 200

    async def listed_to_the_guest() -> bool:
        return machine in await _listed(studio)

    await eventually(listed_to_the_guest)
    assert machine in await _listed(lab)
    assert await _listed(stranger) == {}
    assert (await _share(stranger, machine, {"sharing": "private"})).status == 404


async def test_a_workload_on_another_tenants_machine_says_who_can_see_its_data(
    api: RunningApi,
) -> None:
    _, lab = await new_tenant(api, "lab", "lab-admin")
    studio_id, studio = await new_tenant(api, "studio", "studio-admin")
    machine = await join_machine(api, lab, sharing="community")
    own_machine = await join_machine(api, studio)
    key = {"Idempotency-Key": "guest-launch"}
    launch = {"kind": "notebook", "class": "cpu-1c-2g"}
    guest = await studio.post("/v1/workloads", launch, headers=key)
    at_home = await studio.post("/v1/workloads", launch)
    assert guest.body["placement"] is None  # not placed yet
    assert api.service.store is not None
    async with api.service.store.write() as conn:  # placed as the scheduler's events would
        for workload, on in ((guest.body["id"], machine), (at_home.body["id"], own_machine)):
            await conn.execute(
                sa.text(
                    "UPDATE workloads SET state = 'running', placed_machine = :m, "
                    "placed_region = 'local', placed_class = 'cpu-1c-2g' WHERE id = :id"
                ),
                {"m": on, "id": workload},
            )

    note = f"runs on {machine} owned by lab, who can see its data"
    shown = await studio.get(f"/v1/workloads/{guest.body['id']}")
    assert shown.body["placement"]["host"] == {
        "machine": machine,
        "owner_tenant": "lab",
        "note": note,
    }
    listed = {w["id"]: w for w in (await studio.get("/v1/workloads")).body["items"]}
    assert listed[guest.body["id"]]["placement"]["host"]["note"] == note
    assert listed[at_home.body["id"]]["placement"]["host"] is None  # the tenant's own machine
    replayed = await studio.post("/v1/workloads", launch, headers=key)
    assert replayed.status == 201
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.body["placement"]["host"]["note"] == note
    assert studio_id == shown.body["tenant_id"]


async def test_an_invitation_may_name_one_user_who_accepts_it_themself(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    _, lab = await new_tenant(api, "lab", "lab-admin")
    studio_id, studio = await new_tenant(api, "studio", "studio-admin")
    ada = await new_member(api, studio_id, "ada", by=studio)
    bo = await new_member(api, studio_id, "bo", by=studio)
    ada_id = (await ada.get("/v1/me")).body["user"]["id"]
    machine = await join_machine(api, lab, sharing="invite-only")

    for bad, field in (
        ({}, "tenant"),
        ({"tenant": "studio", "user": "ada"}, "tenant"),
        ({"user": "nobody"}, "user"),
    ):
        refused = await lab.post(f"/v1/machines/{machine}/invitations", bad)
        assert refused.status == 422, refused.text
        assert [d["field"] for d in refused.body["details"]] == [field]
    made = await lab.post(f"/v1/machines/{machine}/invitations", {"user": "ada"})
    assert made.status == 201, made.text
    invitation = made.body
    assert (invitation["user_id"], invitation["username"], invitation["tenant_id"]) == (
        ada_id,
        "ada",
        None,
    )
    again = await lab.post(f"/v1/machines/{machine}/invitations", {"user": "ada"})
    assert (again.status, again.body["id"]) == (200, invitation["id"])

    # Only ada sees and accepts it: not her tenant's admin, not her tenant-mate.
    assert [i["id"] for i in (await ada.get("/v1/machine-invitations")).body["items"]] == [
        invitation["id"]
    ]
    assert (await bo.get("/v1/machine-invitations")).body["items"] == []
    assert (await _accept(studio, invitation["id"])).status == 404
    assert (await _accept(bo, invitation["id"])).status == 404
    accepted = await _accept(ada, invitation["id"])  # a member, not an admin: hers to accept
    assert accepted.status == 200, accepted.text
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert (enrolment.guests, enrolment.guest_users) == ([], [ada_id])  # before the answer
    # She sees the machine; her tenant-mate does not.
    assert machine in {m["id"] for m in (await ada.get("/v1/machines")).body["items"]}
    assert machine not in {m["id"] for m in (await bo.get("/v1/machines")).body["items"]}

    gone = await lab.delete(f"/v1/machines/{machine}/invitations/{invitation['id']}")
    assert gone.status == 204
    enrolment = await enrolment_on_bus(bus.js, machine)
    assert enrolment is not None
    assert enrolment.guest_users == []
    assert machine not in {m["id"] for m in (await ada.get("/v1/machines")).body["items"]}
