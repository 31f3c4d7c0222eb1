"""Another tenant's workload never runs as the control plane (issue 9, hole 3; issue 15).

This machine's agent has only the `process` driver: weak isolation, a process on the host. A
private machine takes only its owner's tenant; shared with a guest tenant, it still takes none
of the guest's workloads (guests need strong isolation). The guest's notebook stays queued and
its timeline says why, each time the reason changes.
"""

from __future__ import annotations

from tests.conftest import Api, OpenApi, StartPlane

from einsora.api.testing import eventually


async def test_a_guests_notebook_waits_on_a_machine_of_weak_isolation(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="process")
    owner = await api_of(plane)
    tenant = await owner.ok("POST", "/v1/tenants", {"name": "guests"})
    invited = await owner.ok(
        "POST", f"/v1/tenants/{tenant['id']}/invitations", {"username": "gina", "role": "admin"}
    )
    status, joined = await owner.call("POST", "/v1/invitations/redeem", {"code": invited["code"]})
    assert status == 201, joined
    guest = Api(owner.http, owner.base, joined["token"]["token"])

    made = await guest.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    queued = await guest.wait_state(made["id"], "queued")
    assert queued["placement"] is None
    events = await guest.ok("GET", f"/v1/workloads/{made['id']}/events")
    reason = events["items"][-1]["reason"]
    assert plane.agent is not None
    machine = plane.agent.machine_id
    assert f"{machine}: not shared with your tenant" in reason

    # Shared with the guest's tenant: it may use the machine, but not its weak isolation.
    await owner.ok("PATCH", f"/v1/machines/{machine}", {"sharing": "invite-only"})
    invitation = await owner.ok(
        "POST", f"/v1/machines/{machine}/invitations", {"tenant": tenant["id"]}
    )
    await guest.ok("POST", f"/v1/machine-invitations/{invitation['id']}/accept")
    weak = (
        f"{machine}: only weak isolation (process) for a notebook without a container image; "
        "guests need strong"
    )

    async def noted() -> bool:
        items = (await guest.ok("GET", f"/v1/workloads/{made['id']}/events"))["items"]
        return any(weak in e["reason"] for e in items)

    await eventually(noted, within_s=20)
    assert (await guest.ok("GET", f"/v1/workloads/{made['id']}"))["state"] == "queued"
    assert plane.running_workloads() == 0
