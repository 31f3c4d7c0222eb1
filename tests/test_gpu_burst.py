"""No GPU is booked to two users at once under a burst of guest and owner launches (issue 15).

Everything real: Solo's control plane in this process, its sim machine with four GPUs shared
with a guest tenant, and a watch on that machine's desired state in the `machines` bucket,
which sees every generation the scheduler writes. While owner and guest launch and remove GPU
notebooks concurrently, no generation may give one GPU to two workloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from tests.conftest import Api, OpenApi, StartPlane, tenant_admin

from einsora.api.testing import eventually
from einsora.common.bus import identities, names
from einsora.common.bus.connect import connect_as
from einsora.common.bus.kv import bind_bucket

GPUS = 4
GPU = {"kind": "notebook", "class": "l40s-48gb"}


class DesiredWatch:
    """Every generation of one machine's desired state; fails the test on a double booking."""

    def __init__(self) -> None:
        self.generations = 0
        self.conflicts: list[str] = []
        self.held_by_tenant: dict[str, set[str]] = {}

    def take(self, value: bytes) -> None:
        desired = json.loads(value)
        self.generations += 1
        holder: dict[str, str] = {}
        for workload in desired["workloads"]:
            if workload["target"] != "running":
                continue
            for gpu in workload["resources"]["gpus"]:
                self.held_by_tenant.setdefault(workload["tenant_id"], set()).add(gpu)
                if gpu in holder:
                    self.conflicts.append(
                        f"generation {desired['generation']}: {gpu} given to {holder[gpu]} "
                        f"and {workload['workload_id']}"
                    )
                holder[gpu] = workload["workload_id"]


async def _states(api: Api, ids: list[str]) -> dict[str, str]:
    return {i: (await api.ok("GET", f"/v1/workloads/{i}"))["state"] for i in ids}


async def _settled(apis: list[tuple[Api, list[str]]], running: int) -> None:
    """Until exactly `running` of the workloads run and the rest wait in the queue."""

    async def holds() -> bool:
        states: list[str] = []
        for api, ids in apis:
            states.extend((await _states(api, ids)).values())
        return states.count("running") == running and all(
            s in ("running", "queued") for s in states
        )

    await eventually(holds, within_s=60)


async def test_a_burst_of_guest_and_owner_launches_never_books_a_gpu_twice(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="sim", sim_inventory=f"{GPUS}x l40s-48gb, 32 cpu, 128 GiB")
    owner = await api_of(plane)
    guest_tenant, guest = await tenant_admin(owner, "guests")
    (machine,) = (await owner.ok("GET", "/v1/machines"))["items"]
    await owner.ok("PATCH", f"/v1/machines/{machine['id']}", {"sharing": "invite-only"})
    invitation = await owner.ok(
        "POST", f"/v1/machines/{machine['id']}/invitations", {"tenant": guest_tenant}
    )
    await guest.ok("POST", f"/v1/machine-invitations/{invitation['id']}/accept")

    watch = DesiredWatch()
    nc = await connect_as(plane.nats_url, identities.SCHEDULER, plane.settings.nats_credentials_dir)
    watcher = await bind_bucket(nc.jetstream(), names.MACHINES).watch(
        names.desired_key(machine["id"])
    )

    async def follow() -> None:
        async for entry in watcher:
            if entry is not None and entry.value:  # None: the initial values are all in
                watch.take(entry.value)

    following = asyncio.create_task(follow())
    try:
        # A burst from both tenants at once: twelve each, for four GPUs.
        launched = await asyncio.gather(
            *(api.ok("POST", "/v1/workloads", GPU) for api in (owner, guest) for _ in range(12))
        )
        mine = [w["id"] for w in launched if w["tenant_id"] != guest_tenant]
        theirs = [w["id"] for w in launched if w["tenant_id"] == guest_tenant]
        await _settled([(owner, mine), (guest, theirs)], running=GPUS)

        # Churn: every running workload removed while four more arrive; the queue takes the
        # freed GPUs, and still no generation gives one to two workloads.
        for _ in range(3):
            running = [
                (api, i)
                for api, ids in ((owner, mine), (guest, theirs))
                for i, state in (await _states(api, ids)).items()
                if state == "running"
            ]
            more = [
                api.ok("POST", "/v1/workloads", GPU) for api in (owner, guest) for _ in range(2)
            ]
            gone = [api.ok("DELETE", f"/v1/workloads/{i}") for api, i in running]
            results: list[Any] = await asyncio.gather(*more, *gone)
            removed = {i for _, i in running}
            for made in results[: len(more)]:
                (theirs if made["tenant_id"] == guest_tenant else mine).append(made["id"])
            mine = [i for i in mine if i not in removed]
            theirs = [i for i in theirs if i not in removed]
            await _settled([(owner, mine), (guest, theirs)], running=GPUS)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await watcher.stop()  # type: ignore[no-untyped-call]
        await nc.close()

    assert watch.conflicts == []
    assert watch.generations > 4  # it saw the churn, not one state
    # Both tenants held GPUs of this machine during the test: the guest's were truly shared.
    assert set(watch.held_by_tenant) == {launched[0]["tenant_id"], guest_tenant}
