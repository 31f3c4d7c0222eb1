"""Usage and quotas across the whole control plane: what runs is metered and reported, and a
quota the operator sets holds launches until it allows them.

Everything real: api, scheduler, accounting and a sim agent in this process, over an embedded
nats-server.
"""

from __future__ import annotations

import asyncio

from tests.conftest import OpenApi, StartPlane


async def test_a_running_gpu_workload_is_metered_and_a_quota_holds_the_next(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="sim", sim_inventory="2x l40s-48gb, 16 cpu, 64 GiB")
    api = await api_of(plane)
    me = await api.ok("GET", "/v1/me")
    tenant = me["tenant"]["id"]
    await api.ok("PUT", f"/v1/tenants/{tenant}/quota", {"max_gpus": {"l40s-48gb": 1}})
    first = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    await api.wait_state(first["id"], "running")
    second = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    held = await api.wait_state(second["id"], "queued")
    timeline = await api.ok("GET", f"/v1/workloads/{held['id']}/events")
    assert timeline["items"][-1]["reason"].startswith(
        "quota: 1 of 1 l40s-48gb in use by your tenant"
    )

    # The running one is metered: its open allocation counts up to now.
    async def metered() -> dict[str, object] | None:
        report = await api.ok("GET", "/v1/usage?group_by=class")
        rows = [r for r in report["items"] if r["group"] == "l40s-48gb" and r["gpu_hours"] > 0]
        return rows[0] if rows else None

    row = None
    for _ in range(100):
        row = await metered()
        if row is not None:
            break
        await asyncio.sleep(0.1)
    assert row is not None, "the running workload was never metered"
    quota = await api.ok("GET", f"/v1/tenants/{tenant}/quota")
    assert quota["quota"]["max_gpus"] == {"l40s-48gb": 1}

    # The operator raises the quota: the held one starts.
    await api.ok("PUT", f"/v1/tenants/{tenant}/quota", {"max_gpus": {"l40s-48gb": 2}})
    await api.wait_state(second["id"], "running")
