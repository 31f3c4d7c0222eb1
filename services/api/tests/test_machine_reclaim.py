"""A machine's owner takes it back against a real api and a real bus: reclaim and release,
the grace and guests' minimum runtime, who may, and the `enrolments` bucket the scheduler
decides from (ADR-0017)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from einsora.api.testing import (
    Client,
    RunningApi,
    enrolment_on_bus,
    eventually,
    join_machine,
    new_member,
    new_tenant,
)
from einsora.common.schemas import Enrolment
from einsora.common.testing import Bus


async def _enrolment(bus: Bus, machine_id: str) -> Enrolment:
    found = await enrolment_on_bus(bus.js, machine_id)
    assert found is not None, f"{machine_id} has no enrolment in the bucket"
    return found


async def _act(client: Client, machine_id: str, action: str) -> Any:
    return await client.post(f"/v1/machines/{machine_id}/{action}")


async def test_the_owners_admin_reclaims_and_releases_and_the_bucket_follows(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    lab_id, lab = await new_tenant(api, "lab", "lab-admin")
    member = await new_member(api, lab_id, "lab-member", by=lab)
    _, stranger = await new_tenant(api, "stranger", "stranger-admin")
    machine = await join_machine(api, lab)
    before = await _enrolment(bus, machine)
    assert (before.reclaimed_at, before.reclaim_grace_s, before.guest_min_runtime_s) == (
        None,
        120,
        600,
    )

    reclaimed = await _act(lab, machine, "reclaim")
    assert reclaimed.status == 200, reclaimed.text
    at = reclaimed.body["enrolment"]["reclaimed_at"]
    assert at is not None
    # The scheduler's copy changed before the answer came.
    enrolment = await _enrolment(bus, machine)
    assert enrolment.reclaimed_at == datetime.fromisoformat(at)
    # Again: it stays reclaimed from the first time.
    again = await _act(lab, machine, "reclaim")
    assert again.status == 200
    assert again.body["enrolment"]["reclaimed_at"] == at

    for action in ("reclaim", "release"):
        refused = await _act(member, machine, action)
        assert refused.status == 403, refused.text
        assert refused.body["request_id"] == refused.request_id
        hidden = await _act(stranger, machine, action)
        assert hidden.status == 404  # a private machine is not told to strangers
        assert machine not in str(hidden.body["details"])
        assert (await _act(lab, "m-nope", action)).status == 404
    assert (await _enrolment(bus, machine)).reclaimed_at == datetime.fromisoformat(at)

    released = await _act(lab, machine, "release")
    assert released.status == 200, released.text
    assert released.body["enrolment"]["reclaimed_at"] is None
    assert (await _enrolment(bus, machine)).reclaimed_at is None
    assert (await _act(lab, machine, "release")).status == 200  # not reclaimed: nothing changes

    by_operator = await _act(api.owner, machine, "reclaim")
    assert by_operator.status == 200
    assert (await _enrolment(bus, machine)).reclaimed_at is not None

    async def listed_reclaimed() -> bool:
        # The list reads the machines view, which follows the bucket.
        listed = await lab.get("/v1/machines")
        shown = [m for m in listed.body["items"] if m["id"] == machine]
        return bool(shown) and shown[0]["enrolment"]["reclaimed_at"] is not None

    await eventually(listed_reclaimed)


async def test_the_owner_sets_the_grace_and_guests_minimum_runtime(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    lab_id, lab = await new_tenant(api, "lab", "lab-admin")
    member = await new_member(api, lab_id, "lab-member", by=lab)
    _, stranger = await new_tenant(api, "stranger", "stranger-admin")
    machine = await join_machine(api, lab)

    body = {"reclaim_grace_s": 30, "guest_min_runtime_s": 0}
    changed = await lab.call("PATCH", f"/v1/machines/{machine}", body)
    assert changed.status == 200, changed.text
    shown = changed.body["enrolment"]
    assert (shown["reclaim_grace_s"], shown["guest_min_runtime_s"]) == (30, 0)
    assert shown["sharing"] == "private"  # what was not given is kept
    enrolment = await _enrolment(bus, machine)
    assert (enrolment.reclaim_grace_s, enrolment.guest_min_runtime_s) == (30, 0)

    both = await lab.call(
        "PATCH", f"/v1/machines/{machine}", {"sharing": "invite-only", "reclaim_grace_s": 45}
    )
    assert both.status == 200, both.text
    enrolment = await _enrolment(bus, machine)
    assert (enrolment.sharing, enrolment.reclaim_grace_s, enrolment.guest_min_runtime_s) == (
        "invite-only",
        45,
        0,
    )

    assert (await member.call("PATCH", f"/v1/machines/{machine}", body)).status == 403
    assert (await stranger.call("PATCH", f"/v1/machines/{machine}", body)).status == 404
    for bad, field in (
        ({"reclaim_grace_s": -1}, "reclaim_grace_s"),
        ({"guest_min_runtime_s": "soon"}, "guest_min_runtime_s"),
        ({"reclaim_grace_s": 10**9}, "reclaim_grace_s"),
    ):
        answer = await lab.call("PATCH", f"/v1/machines/{machine}", bad)
        assert answer.status == 422, (bad, answer.text)
        assert field in [d["field"] for d in answer.body["details"]], answer.body
    enrolment = await _enrolment(bus, machine)
    assert (enrolment.reclaim_grace_s, enrolment.guest_min_runtime_s) == (45, 0)
