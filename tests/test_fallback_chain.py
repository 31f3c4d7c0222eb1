"""A fallback chain through the whole control plane (ADR-0022): the api checks and sends it,
the scheduler walks it, the timeline says each step, and the placement and `/v1/regions` show
where it landed and what is left.

Everything real: the api, the scheduler and a sim agent in this process, over an embedded
nats-server.
"""

from __future__ import annotations

from tests.conftest import OpenApi, StartPlane

from einsora.api.testing import eventually


async def test_a_launch_falls_back_along_its_chain_and_says_so(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="sim", sim_inventory="1x l40s-48gb, 16 cpu, 64 GiB")
    api = await api_of(plane)
    first = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    await api.wait_state(first["id"], "running")
    chained = await api.ok(
        "POST",
        "/v1/workloads",
        {
            "kind": "notebook",
            "class": "l40s-48gb",
            "fallback": [{"class": "a100-80gb"}, {"class": "cpu-4c-16g"}],
        },
    )
    running = await api.wait_state(chained["id"], "running")
    assert running["placement"]["placed_class"] == "cpu-4c-16g"
    assert running["placement"]["region"] == "local"
    timeline = await api.ok("GET", f"/v1/workloads/{chained['id']}/events")
    reasons = [e["reason"] for e in timeline["items"]]
    assert "l40s-48gb: none free in local (1 of 1 in use); trying a100-80gb" in reasons
    assert "a100-80gb: no machine in local offers it; trying cpu-4c-16g" in reasons
    machine = plane.agent.machine_id  # type: ignore[union-attr]
    assert any(
        r.startswith(f"placed on {machine} as cpu-4c-16g, fallback step 2 of 2") for r in reasons
    )
    # The region's scheduler says what it has left (its next heartbeat): the GPU is taken, and
    # 12 of the 16 cores and 48 of the 64 GiB are free, so 3 more of that CPU class fit.

    async def told() -> bool:
        regions = {r["name"]: r for r in (await api.ok("GET", "/v1/regions"))["items"]}
        local = regions["local"]
        return bool(
            local["scheduler"]["state"] == "up"
            and local["available_machines"] == 1
            and local["free"].get("cpu-4c-16g") == 3
            and "l40s-48gb" not in local["free"]
        )

    await eventually(told, within_s=20)
