"""Two machines of two owners, each its own agent process with its own credential, shared with
each other's tenant; the trust matrix, the host note and a reclaim, end to end (issue 15).

Everything real: Solo's control plane in this process (its own machine too small for a GPU
class), two tenants, and for each a machine that joins with `einsora agent join` and runs
`einsora agent --driver sim` (strong isolation: it runs nothing) as a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Api, OpenApi, StartPlane, tenant_admin

from einsora.api.testing import eventually
from einsora.common.testing import subprocess_env

EINSORA = Path(sys.executable).parent / "einsora"
GPU = {"kind": "notebook", "class": "l40s-48gb"}


async def _machine(
    admin: Api, data_dir: Path, log: Path, processes: list[asyncio.subprocess.Process]
) -> str:
    """Join a machine as this admin's tenant's and start its agent; its id once it reports."""
    token = await admin.ok("POST", "/v1/machines/join-tokens", {"tunnel": False})
    env = subprocess_env(EINSORA_DATA_DIR=str(data_dir), EINSORA_LOG_FORMAT="text")
    join = await asyncio.create_subprocess_exec(
        str(EINSORA), "agent", "join", admin.base, "--token", "-", "--data-dir", str(data_dir),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    said, _ = await asyncio.wait_for(join.communicate(token["token"].encode()), 60)
    assert join.returncode == 0, said.decode()
    found = re.search(r" as machine ([\w-]+):", said.decode())
    assert found is not None, said.decode()
    with log.open("wb") as out:
        agent = await asyncio.create_subprocess_exec(
            str(EINSORA), "agent", "--driver", "sim", "--data-dir", str(data_dir),
            "--sim-inventory", "1x l40s-48gb, 8 cpu, 32 GiB", "--heartbeat", "1",
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    processes.append(agent)
    machine_id = found[1]
    await _until(admin, lambda m: _reported(m, machine_id), f"{machine_id} reported")
    return machine_id


def _reported(machines: list[dict[str, Any]], machine_id: str) -> bool:
    return any(m["id"] == machine_id and m["inventory"] for m in machines)


async def _until(api: Api, check: Any, what: str, within_s: float = 30) -> None:
    """Until `check` holds for the machines `api`'s caller sees (`what` names it)."""

    async def holds() -> bool:
        return bool(check((await api.ok("GET", "/v1/machines"))["items"]))

    try:
        await eventually(holds, within_s=within_s)
    except AssertionError as exc:
        raise AssertionError(f"never: {what}") from exc


async def test_two_owners_share_their_machines_and_one_takes_its_back(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    # No GPU of its own; its operator lets tenant admins' machines on this host join directly.
    plane = await start_plane(
        driver="sim",
        sim_inventory="8 cpu, 32 GiB",
        settings={"direct_machine_networks": "127.0.0.0/8"},
    )
    owner = await api_of(plane)
    _, alice = await tenant_admin(owner, "alice")
    bob_tenant, bob = await tenant_admin(owner, "bob")
    processes: list[asyncio.subprocess.Process] = []
    try:
        m_alice = await _machine(alice, tmp_path / "a", tmp_path / "a.log", processes)
        m_bob = await _machine(bob, tmp_path / "b", tmp_path / "b.log", processes)
        # Each sees its own machine only: the other's is private.
        await _until(bob, lambda ms: {m["id"] for m in ms} == {m_bob}, "bob sees his own only")

        first = await bob.ok("POST", "/v1/workloads", GPU)
        placed = await bob.wait_state(first["id"], "running")
        assert placed["placement"]["machine"] == m_bob
        assert placed["placement"]["host"] is None  # his own machine
        second = await bob.ok("POST", "/v1/workloads", GPU)
        # Queued behind his own busy GPU: alice's free one is not his to use.
        await bob.wait_state(second["id"], "queued")

        # Alice shares hers with bob's tenant (no grace, no minimum runtime for the reclaim).
        await alice.ok(
            "PATCH",
            f"/v1/machines/{m_alice}",
            {"sharing": "invite-only", "reclaim_grace_s": 0, "guest_min_runtime_s": 0},
        )
        invitation = await alice.ok(
            "POST", f"/v1/machines/{m_alice}/invitations", {"tenant": bob_tenant}
        )
        await bob.ok("POST", f"/v1/machine-invitations/{invitation['id']}/accept")
        running = await bob.wait_state(second["id"], "running")
        assert running["placement"]["machine"] == m_alice
        host = running["placement"]["host"]
        assert host["owner_tenant"] == "alice"
        assert host["note"] == f"runs on {m_alice} owned by alice, who can see its data"
        # Bob shared nothing: alice still sees only her own machine.
        mine = {m["id"] for m in (await alice.ok("GET", "/v1/machines"))["items"]}
        assert mine == {m_alice}

        # Alice takes it back: bob's workload is preempted, with the reason; hers can run there.
        await alice.ok("POST", f"/v1/machines/{m_alice}/reclaim")
        await bob.wait_state(second["id"], "preempted")
        events = (await bob.ok("GET", f"/v1/workloads/{second['id']}/events"))["items"]
        assert "owner reclaimed the machine" in events[-1]["reason"]
        hers = await alice.ok("POST", "/v1/workloads", GPU)
        assert (await alice.wait_state(hers["id"], "running"))["placement"]["machine"] == m_alice
        assert (await bob.ok("GET", f"/v1/workloads/{first['id']}"))["state"] == "running"
    finally:
        for agent in processes:
            with contextlib.suppress(ProcessLookupError):
                agent.terminate()
        for agent in processes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(agent.wait(), 20)
