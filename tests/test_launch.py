"""A launch through the API becomes a running workload, with its story on the timeline.

Everything real: the api, the scheduler and an agent (sim, then process) in this process, talking
over an embedded nats-server.
"""

from __future__ import annotations

import pytest
from tests.conftest import OpenApi, StartPlane


async def test_a_sim_launch_reaches_running_and_tells_its_story(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(
        driver="sim", sim_inventory="2x l40s-48gb, 16 cpu, 64 GiB", sim_start_delay_s=0.3
    )
    api = await api_of(plane)
    made = await api.ok("POST", "/v1/workloads", {"kind": "endpoint", "class": "l40s-48gb"})
    assert made["state"] == "pending"
    running = await api.wait_state(made["id"], "running")
    assert running["placement"]["machine"] == plane.agent.machine_id  # type: ignore[union-attr]
    assert running["placement"]["placed_class"] == "l40s-48gb"
    timeline = await api.ok("GET", f"/v1/workloads/{made['id']}/events")
    states = [e["state"] for e in timeline["items"] if e["kind"] == "transition"]
    assert states[0] == "pending"
    assert states[-1] == "running"
    assert {"scheduled", "starting"} <= set(states)
    assert all(e["reason"] for e in timeline["items"])


async def test_queued_when_full_then_admitted_when_capacity_frees(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="sim", sim_inventory="1x l40s-48gb, 8 cpu, 32 GiB")
    api = await api_of(plane)
    first = await api.ok("POST", "/v1/workloads", {"kind": "endpoint", "class": "l40s-48gb"})
    await api.wait_state(first["id"], "running")
    second = await api.ok("POST", "/v1/workloads", {"kind": "endpoint", "class": "l40s-48gb"})
    await api.wait_state(second["id"], "queued")
    timeline = await api.ok("GET", f"/v1/workloads/{second['id']}/events")
    assert any("l40s-48gb" in e["reason"] for e in timeline["items"] if e["state"] == "queued")

    await api.ok("DELETE", f"/v1/workloads/{first['id']}")
    await api.wait_state(first["id"], "removed")
    await api.wait_state(second["id"], "running")


async def test_park_and_resume_and_remove(start_plane: StartPlane, api_of: OpenApi) -> None:
    plane = await start_plane(driver="sim", sim_inventory="1x l40s-48gb, 8 cpu, 32 GiB")
    api = await api_of(plane)
    made = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    await api.wait_state(made["id"], "running")
    await api.ok("POST", f"/v1/workloads/{made['id']}/park")
    await api.wait_state(made["id"], "parked")
    status, body = await api.call("POST", f"/v1/workloads/{made['id']}/park")
    assert status == 409, body
    await api.ok("POST", f"/v1/workloads/{made['id']}/resume")
    await api.wait_state(made["id"], "running")
    await api.ok("DELETE", f"/v1/workloads/{made['id']}")
    await api.wait_state(made["id"], "removed")


@pytest.mark.slow
async def test_a_process_notebook_reaches_running(start_plane: StartPlane, api_of: OpenApi) -> None:
    plane = await start_plane(driver="process")
    api = await api_of(plane)
    made = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    await api.wait_state(made["id"], "running", within_s=90)
    await api.ok("DELETE", f"/v1/workloads/{made['id']}")
    await api.wait_state(made["id"], "removed")
