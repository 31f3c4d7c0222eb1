"""The agent works under Lab's per-machine NATS permissions (FIELD-NOTES, checked allow by
allow): it reads and watches only its own desired key, writes only its own observed and
inventory keys, and uses its own inbox prefix. A nats-server with exactly that allow-list runs
the test; any other subject the agent touched would be a permissions violation."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from einsora.agent.service import AgentService
from einsora.common.bus import bind_bucket, connect, names, provision
from einsora.common.embedded_nats import nats_server_binary
from einsora.common.schemas import ObservedPhase
from einsora.common.settings import Settings
from einsora.testing.agent import ControlPlane

MACHINE = "m-perm"


def _agent_permissions(m: str) -> str:
    publish = [
        f"$JS.API.DIRECT.GET.KV_machines.$KV.machines.{m}.desired",
        f"$JS.API.CONSUMER.CREATE.KV_machines.{m}_desired.$KV.machines.{m}.desired",
        f"$JS.API.CONSUMER.DELETE.KV_machines.{m}_desired",
        "$JS.FC.KV_machines.>",
        f"$KV.machines.{m}.observed",
        f"$KV.machines.{m}.inventory",
    ]
    subscribe = [f"_INBOX_{m}.>", f"$KV.machines.{m}.desired"]

    def quoted(items: list[str]) -> str:
        return ", ".join(f'"{i}"' for i in items)

    return (
        f'{{user: "{m}", password: "pw", permissions: {{'
        f"publish: {{allow: [{quoted(publish)}]}}, subscribe: {{allow: [{quoted(subscribe)}]}}}}}}"
    )


@pytest.fixture
def locked_nats(tmp_path: Path) -> Iterator[int]:
    """A nats-server where `m-perm` may touch only its own keys; `admin` may do anything."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "nats.log"
    config = tmp_path / "nats.conf"
    config.write_text(
        f"""listen: "127.0.0.1:{port}"
log_file: "{log}"
jetstream {{ store_dir: "{tmp_path / "js"}" }}
authorization {{ users: [ {{user: admin, password: admin}}, {_agent_permissions(MACHINE)} ] }}
"""
    )
    proc = subprocess.Popen([str(nats_server_binary()), "-c", str(config)])
    deadline = time.monotonic() + 10
    while "Server is ready" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, "nats-server exited at start"
        assert time.monotonic() < deadline, "nats-server did not start within 10 s"
        time.sleep(0.01)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        violations = [line for line in log.read_text().splitlines() if "Violation" in line]
        assert violations == [], "the agent used subjects beyond its own keys"


@pytest.mark.slow
async def test_agent_runs_with_only_its_own_keys(locked_nats: int, data_dir: Path) -> None:
    admin = await connect(f"nats://admin:admin@127.0.0.1:{locked_nats}", name="test-admin")
    await provision(admin.jetstream())
    control = ControlPlane(admin, bind_bucket(admin.jetstream(), names.MACHINES))
    await control.put_desired("m-someone-else", 1, [control.workload("w-theirs")])
    agent = AgentService(
        Settings(nats_url=f"nats://{MACHINE}:pw@127.0.0.1:{locked_nats}", data_dir=data_dir),
        machine_id=MACHINE,
        driver="sim",
        sim_inventory="1x l4-24gb",
        heartbeat_s=0.3,
        resync_s=0.5,
    )
    await agent.start()
    try:
        await control.put_desired(MACHINE, 1, [control.workload("w-mine")])
        await control.wait_workload(MACHINE, "w-mine", lambda w: w.phase is ObservedPhase.running)
        await control.put_desired(MACHINE, 2, [])
        await control.wait_observed(MACHINE, lambda s: s.generation_applied == 2)
        inv = await control.inventory(MACHINE)
        assert inv is not None
        assert len(inv.gpus) == 1
        # A rewatch (as after a reconnect) and periodic resyncs stay within the allow-list.
        await agent.machines[MACHINE].rewatch()
        await control.put_desired(MACHINE, 3, [control.workload("w-again")])
        await control.wait_workload(MACHINE, "w-again", lambda w: w.phase is ObservedPhase.running)
    finally:
        await agent.stop()
        await admin.close()
