"""Another tenant's workload never runs as the control plane (issue 9, hole 3).

This machine's agent has only the `process` driver: weak isolation, a process on the host. Until
machines are shared with strong isolation, only the owner's tenant is placed there; a guest's
notebook stays queued and its timeline says why.
"""

from __future__ import annotations

from tests.conftest import Api, OpenApi, StartPlane


async def test_a_guests_notebook_waits_on_a_machine_of_weak_isolation(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="process")
    owner = await api_of(plane)
    tenant = await owner.ok("POST", "/v1/tenants", {"name": "guests"})
    invited = await owner.ok(
        "POST", f"/v1/tenants/{tenant['id']}/invitations", {"username": "gina"}
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
    assert plane.agent.machine_id in reason
    assert "weak isolation" in reason
    assert plane.running_workloads() == 0
