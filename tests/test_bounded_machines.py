"""Machines are bounded (issue 34, N7): a joined machine that rewrites a large inventory in a
loop holds up no other tenant's launch, and what it sends past its limits the server refuses.

Everything real: Solo's control plane in this process (NATS in the accounts layout, the api's
auth callout, the scheduler, Solo's own sim agent), a second tenant that joins a machine with
`einsora.agent.join`, and, in place of that machine's agent, a client speaking the agent's bus
protocol with the machine's own credential (its own inbox prefix, its own keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from tests.conftest import Api, OpenApi, StartPlane, tenant_admin

from einsora.agent.join import Enrolled, join
from einsora.cli.controlplane import ControlPlane
from einsora.common.bus import bind_bucket, identities, names
from einsora.common.bus.connect import connect_as
from einsora.common.schemas import Gpu, Inventory

LAUNCH_BOUND_S = 1.5
"""How long another tenant's launch may take to be scheduled while the flood runs (about 0.1 s
without one; 3 s and more here, 20 s on the finding's host, before machines were bounded):
generous, for a busy 2-core host."""
LAUNCHES = 3
FLOOD_GPUS = 1_500
"""An inventory of about 470 KiB: under what the server lets a machine publish at all, far over
what an inventory may hold."""
HUGE_GPUS = 3_250
"""An inventory of about 1 MiB, as in the finding: under the server's limit for every client."""


def _inventory(machine_id: str, gpus: int, revision: int = 0) -> Inventory:
    return Inventory(
        machine_id=machine_id,
        region="local",
        hostname=f"flood-{revision}",
        os="linux",
        arch="x86_64",
        cpus=64,
        memory_mib=512 * 1024,
        gpus=[
            Gpu(
                index=i,
                uuid=f"GPU-{machine_id}-{revision}-{i}",
                model="NVIDIA L40S",
                memory_mib=46068,
            )
            for i in range(min(gpus, 256))
        ],
        drivers=["sim"],
    )


def _claim(machine_id: str, gpus: int, revision: int = 0) -> bytes:
    """An inventory that claims `gpus` GPUs, as a machine may write it whatever its limits."""
    claim = _inventory(machine_id, 1, revision).model_dump(mode="json")
    claim["gpus"] = [
        dict(claim["gpus"][0], index=i, uuid=f"GPU-{machine_id}-{revision}-{i}")
        for i in range(gpus)
    ]
    return json.dumps(claim).encode()


async def _connect_as_machine(
    enrolled: Enrolled, errors: list[str], closed: asyncio.Event | None = None
) -> NATS:
    """A client with the machine's credential and inbox prefix, as its agent connects."""

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    async def on_closed() -> None:
        if closed is not None:
            closed.set()

    nc = NATS()
    await nc.connect(
        enrolled.nats_url,
        token=enrolled.credential.get_secret_value(),
        inbox_prefix=identities.inbox_prefix(enrolled.machine_id),
        error_cb=on_error,
        closed_cb=on_closed,
        allow_reconnect=False,
        connect_timeout=5,
    )
    return nc


@pytest_asyncio.fixture
async def guest_machine(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> AsyncIterator[tuple[ControlPlane, Api, Enrolled]]:
    """Solo (its own machine runs the owner's work) and a machine another tenant joined."""
    plane = await start_plane(driver="sim", sim_inventory="16 cpu, 64 GiB")
    owner = await api_of(plane)
    _, guest = await tenant_admin(owner, "flooders")
    token = await guest.ok("POST", "/v1/machines/join-tokens", {})
    enrolled = await join(tmp_path / "flooder", guest.base, token["token"])
    yield plane, owner, enrolled


async def test_a_machine_rewriting_a_large_inventory_in_a_loop_holds_up_no_other_launch(
    guest_machine: tuple[ControlPlane, Api, Enrolled],
) -> None:
    _, owner, enrolled = guest_machine
    key = names.inventory_key(enrolled.machine_id)
    # As in the finding, about 1 MiB (the server's limit for everyone), and, from a second
    # connection of the same machine, about 470 KiB (under what a machine may publish).
    largest = [_claim(enrolled.machine_id, HUGE_GPUS, r) for r in range(4)]
    large = [_claim(enrolled.machine_id, FLOOD_GPUS, r) for r in range(4)]
    assert all(900 * 1024 < len(v) < 1024 * 1024 for v in largest)
    assert all(256 * 1024 < len(v) < 512 * 1024 for v in large)
    tries = {"written": 0, "refused": 0}
    under_way = asyncio.Event()
    done = asyncio.Event()

    async def flood(values: list[bytes]) -> None:
        """Rewrite the inventory until the test is done, connecting again whenever the server
        hangs up. The flag as well as the cancel: Python 3.11's wait_for (inside nats-py's
        request) can swallow a cancel that lands as its reply does, and the test then waited
        for the flood for ever."""
        while not done.is_set():
            nc = await _connect_as_machine(enrolled, [])
            kv = bind_bucket(nc.jetstream(), names.MACHINES)
            try:
                while not done.is_set():
                    await kv.put(key, values[tries["written"] % len(values)])
                    tries["written"] += 1
                    if sum(tries.values()) >= 20:
                        under_way.set()
            except (nats.errors.Error, TimeoutError):
                tries["refused"] += 1
                if sum(tries.values()) >= 20:
                    under_way.set()
            finally:
                await nc.close()

    floods = [asyncio.create_task(flood(largest)), asyncio.create_task(flood(large))]
    try:
        await asyncio.wait_for(under_way.wait(), 60)  # the floods run before the launches
        for _ in range(LAUNCHES):
            started = time.monotonic()
            made = await owner.ok(
                "POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"}
            )
            await owner.wait_state(
                made["id"], "scheduled", "starting", "running", within_s=LAUNCH_BOUND_S
            )
            took = time.monotonic() - started
            print(f"scheduled in {took:.2f} s while the floods ran ({tries} so far)")
        assert not any(f.done() for f in floods)
    finally:
        done.set()
        for f in floods:
            f.cancel()
        for f in floods:
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
                await f


async def test_a_machine_publishing_past_its_payload_limit_is_refused_by_the_server(
    guest_machine: tuple[ControlPlane, Api, Enrolled],
) -> None:
    plane, _, enrolled = guest_machine
    errors: list[str] = []
    closed = asyncio.Event()
    nc = await _connect_as_machine(enrolled, errors, closed)
    key = names.inventory_key(enrolled.machine_id)
    kv = bind_bucket(nc.jetstream(), names.MACHINES)
    await kv.put(key, _inventory(enrolled.machine_id, 1).to_bytes())  # within its limits
    too_large = _claim(enrolled.machine_id, 3_000)
    assert 512 * 1024 < len(too_large) < 1024 * 1024  # under the server's own limit for all
    with pytest.raises((nats.errors.Error, TimeoutError)):
        await kv.put(key, too_large)
    await asyncio.wait_for(closed.wait(), 5)  # the server closed the connection
    assert plane.nats is not None
    assert "maximum payload exceeded" in plane.nats.log_file.read_text()
    # What the bucket holds is still what the machine sent within its limits.
    reader = await connect_as(
        plane.nats_url, identities.SCHEDULER, plane.settings.nats_credentials_dir
    )
    try:
        stored = await bind_bucket(reader.jetstream(), names.MACHINES).get(key)
    finally:
        await reader.close()
    assert stored.value is not None
    assert len(stored.value) < 512 * 1024
