"""The cell's machines: each sim agent's enrolled by the operator, and machines that join the
documented way.

The operator enrols a sim agent's machines with `POST /v1/machines/sim-agents` (issue 35); a
joined machine takes a join token, runs `einsora agent join` and then `einsora agent`, with
nothing but what the join gave it.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

import aiohttp
from tests.chaos.process import EINSORA

if TYPE_CHECKING:
    from tests.chaos.cell import Cell

REGION = "local"
"""The cell's one region."""


async def enrol_sim_agents(cell: Cell, http: aiohttp.ClientSession) -> None:
    """The operator enrols each sim agent's machines (`einsora machines enrol-sim` does the
    same), before the schedulers start: they count them from their first read."""
    for agent, machines in cell.sim_machines.items():
        body = {"agent": agent, "count": len(machines)}
        async with http.post(
            f"{cell.api_url}/v1/machines/sim-agents", json=body, headers=cell.auth()
        ) as resp:
            made = await resp.json()
            assert resp.status == 201, made
        assert made["machine_ids"] == machines, made


async def join(cell: Cell, http: aiohttp.ClientSession, name: str) -> None:
    """A machine joins the documented way: a join token, `einsora agent join`, then
    `einsora agent`, with only what the join gave it."""
    async with http.post(
        f"{cell.api_url}/v1/machines/join-tokens",
        json={"name": name, "tunnel": False},
        headers=cell.auth(),
    ) as resp:
        assert resp.status == 201, await resp.text()
        token = (await resp.json())["token"]
    env = cell.env(name, static_identity=False)
    joining = await asyncio.create_subprocess_exec(
        *(EINSORA, "agent", "join", cell.api_url, "--token", "-"),
        *("--data-dir", str(cell.data(name))),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    said, _ = await asyncio.wait_for(joining.communicate(token.encode()), 60)
    found = re.search(r" as machine ([\w-]+):", said.decode())
    assert joining.returncode == 0, said.decode()
    assert found is not None, said.decode()
    proc = cell.service(
        name,
        [
            *("agent", "--driver", "sim", "--sim-inventory", cell.shape.joined_inventory),
            *("--heartbeat", f"{cell.shape.heartbeat_s:g}"),
            *("--data-dir", str(cell.data(name))),
        ],
        static_identity=False,
    )
    cell.joined.append(proc)
    cell.joined_machines[name] = found[1]
    proc.start()


async def reporting(cell: Cell, http: aiohttp.ClientSession) -> bool:
    """Whether every machine of the cell has reported its inventory, as the api lists them."""
    for proc in cell.services:
        if not proc.alive:
            raise AssertionError(f"{proc.name} exited:\n{proc.tail()}")
    seen: set[str] = set()
    cursor: str | None = None
    while True:
        params = {"limit": "200", **({"cursor": cursor} if cursor else {})}
        async with http.get(
            f"{cell.api_url}/v1/machines", params=params, headers=cell.auth()
        ) as resp:
            if resp.status != 200:
                return False
            page = await resp.json()
        seen |= {m["id"] for m in page["items"] if m.get("inventory") is not None}
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return set(cell.machine_ids()) <= seen
