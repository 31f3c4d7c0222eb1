"""A joined machine is believed only about itself (issue 34, N1 and N3; ADR-0026).

Everything real: Solo's control plane in this process, a machine that joins over HTTP with a
join token, and that machine played by a process speaking the agent's bus protocol with the
machine's own credential, reporting what a hostile agent would: its workload "answers" at the
control plane's own API port, or at an address that is not the machine's, or on thousands of
ports. The route goes only where the machine is, never to the control plane's ports, and the
proxy opens no socket for a port the route does not carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue
from tests.conftest import Api, OpenApi, StartPlane, tenant_admin

from einsora.agent.join import Enrolled, join
from einsora.api.testing import eventually
from einsora.cli.controlplane import ControlPlane
from einsora.common.bus import bind_bucket, close_quietly, connect, names
from einsora.common.schemas import (
    DesiredState,
    Endpoint,
    Gpu,
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
)

pytestmark = pytest.mark.slow


class HostileMachine:
    """A joined machine's side of the bus, with its own credential, saying what it likes."""

    def __init__(self, enrolled: Enrolled, nc: NATS, kv: KeyValue) -> None:
        self.enrolled, self.nc, self.kv = enrolled, nc, kv

    @classmethod
    async def connect(cls, plane: ControlPlane, enrolled: Enrolled) -> HostileMachine:
        nc = await connect(
            plane.nats_url,
            name=f"hostile {enrolled.machine_id}",
            inbox_prefix=names.agent_inbox_prefix(enrolled.machine_id),
            token=enrolled.credential.get_secret_value(),
            tls=enrolled.nats_tls(),
        )
        return cls(enrolled, nc, bind_bucket(nc.jetstream(), names.MACHINES))

    @property
    def machine_id(self) -> str:
        return self.enrolled.machine_id

    async def report_inventory(self) -> None:
        inventory = Inventory(
            machine_id=self.machine_id,
            region=self.enrolled.region,
            hostname="hostile",
            os="linux",
            arch="x86_64",
            cpus=16,
            memory_mib=65536,
            gpus=[Gpu(index=0, uuid="GPU-hostile-0", model="NVIDIA L40S", memory_mib=46068)],
            drivers=["process"],
        )
        await self.kv.put(names.inventory_key(self.machine_id), inventory.to_bytes())

    async def desired(self) -> DesiredState | None:
        try:
            entry = await self.kv.get(names.desired_key(self.machine_id))
        except Exception:
            return None
        return None if entry.value is None else DesiredState.from_bytes(entry.value)

    async def run_as(self, workload_id: str, endpoint: Endpoint) -> None:
        """Say `workload_id` runs and answers at `endpoint` (whatever is really there)."""
        desired = await self.desired()
        generation = 0 if desired is None else desired.generation
        observed = ObservedState(
            machine_id=self.machine_id,
            generation_applied=generation,
            workloads=[
                ObservedWorkload(
                    workload_id=workload_id, phase=ObservedPhase.running, endpoint=endpoint
                )
            ],
        )
        await self.kv.put(names.observed_key(self.machine_id), observed.to_bytes())

    async def close(self) -> None:
        await close_quietly(self.nc)


async def _joined(plane: ControlPlane, api: Api, tmp: Path, body: dict[str, Any]) -> Enrolled:
    token = await api.ok("POST", "/v1/machines/join-tokens", body)
    return await join(tmp, api.base, token["token"])


async def _placed_there(api: Api, machine: HostileMachine) -> str:
    """A GPU notebook of the owner's, placed on the hostile machine (the only L40S)."""
    made = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})

    async def placed() -> bool:
        desired = await machine.desired()
        return desired is not None and any(w.workload_id == made["id"] for w in desired.workloads)

    await eventually(placed, what="the notebook in the hostile machine's desired state")
    return str(made["id"])


async def _timeline(api: Api, workload_id: str) -> list[str]:
    events = await api.ok("GET", f"/v1/workloads/{workload_id}/events")
    return [e["reason"] for e in events["items"]]


async def test_a_tenant_admin_cannot_make_direct_machines_and_a_direct_one_is_routed_to_itself(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    plane = await start_plane(driver="sim", sim_inventory="8 cpu, 32 GiB")
    api = await api_of(plane)
    _tenant, admin = await tenant_admin(api, "acme")
    status, body = await admin.call("POST", "/v1/machines/join-tokens", {"tunnel": False})
    assert status == 403, body
    assert "operator" in body["message"], body
    assert body["request_id"], body

    # The operator may: the machine is enrolled at the address it joined from.
    enrolled = await _joined(plane, api, tmp_path / "direct", {"tunnel": False})
    machines = {m["id"]: m for m in (await api.ok("GET", "/v1/machines"))["items"]}
    assert machines[enrolled.machine_id]["enrolment"]["address"] == "127.0.0.1"
    hostile = await HostileMachine.connect(plane, enrolled)
    try:
        await hostile.report_inventory()
        first = await _placed_there(api, hostile)
        # It says the notebook answers on the control plane's own API port: no route, and
        # the timeline says why.
        await hostile.run_as(first, Endpoint(host="127.0.0.1", port=plane.api_port))
        await api.wait_state(first, "running")

        async def refused() -> bool:
            return any("one of the control plane's own" in r for r in await _timeline(api, first))

        await eventually(refused, what="the route refused on the timeline")
        assert await _route(plane, first) is None

        # It says the notebook answers at another address: the route goes to the machine.
        await hostile.run_as(first, Endpoint(host="10.66.0.1", port=45123))

        async def routed() -> bool:
            found = await _route(plane, first)
            return found is not None and (found.host, found.port) == ("127.0.0.1", 45123)

        await eventually(routed, what="a route at the machine's own address")
    finally:
        await hostile.close()


async def _route(plane: ControlPlane, workload_id: str) -> Any:
    assert plane.proxy is not None
    routes = plane.proxy._routes
    return None if routes is None else routes.get(workload_id)


async def test_an_admins_direct_machine_joins_only_from_a_network_the_operator_allows(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    plane = await start_plane(
        driver="sim",
        sim_inventory="8 cpu, 32 GiB",
        settings={"direct_machine_networks": "10.0.0.0/8"},
    )
    api = await api_of(plane)
    _tenant, admin = await tenant_admin(api, "acme")
    status, body = await admin.call(
        "POST", "/v1/machines/join-tokens", {"tunnel": False, "address": "192.168.1.9"}
    )
    assert status == 403, body
    assert "192.168.1.9" in body["message"]
    token = await admin.ok("POST", "/v1/machines/join-tokens", {"tunnel": False})
    # This join comes from 127.0.0.1, outside the operator's networks: refused, use kept.
    status, body = await admin.call(
        "POST", "/v1/machines/join", {"token": token["token"], "hostname": "box"}
    )
    assert status == 403, body
    assert "127.0.0.1 is not in the networks" in body["message"]
    tokens = (await admin.ok("GET", "/v1/machines/join-tokens"))["items"]
    assert [t["used"] for t in tokens] == [0]
