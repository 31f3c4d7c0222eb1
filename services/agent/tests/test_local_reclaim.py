"""`einsora agent reclaim` on the machine itself, with the control plane unreachable (ADR-0017):
the running agent parks its guests' workloads after the grace, never the owner's, and reports
it all once NATS is back; `einsora agent release` lets the guests run again."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import nats.errors
from pydantic import SecretStr

from einsora.agent import reclaim
from einsora.agent.join import Enrolled
from einsora.agent.service import AgentService
from einsora.common.bus import bind_bucket, connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import ObservedPhase, SharingLevel, utcnow
from einsora.common.settings import Settings
from einsora.testing.agent import ControlPlane

MACHINE = "m-mine"
OWNER = "t-alice"
WAIT_S = 20.0


def _agent_command(data_dir: Path, *args: str) -> str:
    """Run `einsora agent …` as its own process, as the owner would on the machine."""
    done = subprocess.run(
        [sys.executable, "-m", "einsora.agent", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _until(check: Callable[[], bool], what: str) -> None:
    """Poll a condition of the in-process agent with a deadline."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _put_desired(control: ControlPlane, generation: int) -> None:
    guest = control.workload("w-guest")  # the tenant t-test: a guest here
    own = control.workload("w-own").model_copy(update={"tenant_id": OWNER})
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            await control.put_desired(MACHINE, generation, [guest, own])
            return
        except (nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_a_local_reclaim_parks_guests_while_the_control_plane_is_away(
    own_nats_server: EmbeddedNats, data_dir: Path
) -> None:
    nc = await connect(own_nats_server.url, name="test-scheduler")
    await provision(nc.jetstream())
    control = ControlPlane(nc, bind_bucket(nc.jetstream(), names.MACHINES))
    enrolment = Enrolled(
        machine_id=MACHINE,
        credential=SecretStr("agk_test-credential-never-checked-here"),
        owner_tenant_id=OWNER,
        region="local",
        sharing=SharingLevel.invite_only,
        api_url="http://127.0.0.1:9",
        nats_url=own_nats_server.url,
        hostname="mine",
    )
    agent = AgentService(
        Settings(nats_url=own_nats_server.url, data_dir=data_dir),
        driver="sim",
        heartbeat_s=0.5,
        enrolment=enrolment,
    )
    await agent.start()
    try:
        await _put_desired(control, 1)
        await control.wait_observed(
            MACHINE,
            lambda s: (
                {w.workload_id: w.phase for w in s.workloads}
                == {"w-guest": ObservedPhase.running, "w-own": ObservedPhase.running}
            ),
        )
        machine = agent.machines[MACHINE]

        own_nats_server.stop()
        said = _agent_command(data_dir, "reclaim", "--grace", "1", "--guest-min-runtime", "0")
        assert "reclaimed since" in said
        made = reclaim.read(data_dir)
        assert made is not None
        assert (reclaim.path(data_dir).stat().st_mode & 0o777) == 0o600
        # Reclaim again: it stays reclaimed from the first time.
        _agent_command(data_dir, "reclaim", "--grace", "300")
        assert reclaim.read(data_dir) == made

        guest = machine.supervisors["w-guest"]
        await _until(lambda: guest.phase is ObservedPhase.parked, "the guest parked")
        parked_by = utcnow()
        assert parked_by >= made.at + timedelta(seconds=1)  # not before its grace
        assert machine.supervisors["w-own"].phase is ObservedPhase.running
        assert machine.inventory.reclaimed_at == made.at

        own_nats_server.start()
        state = await control.wait_observed(
            MACHINE,
            lambda s: (
                {w.workload_id: w.phase for w in s.workloads}
                == {"w-guest": ObservedPhase.parked, "w-own": ObservedPhase.running}
            ),
            within_s=WAIT_S,
        )
        assert state.generation_applied == 1
        await _until_inventory(control, lambda at: at == made.at)

        # The control plane still says run (it has not preempted it yet): it stays parked.
        await _put_desired(control, 2)
        await control.wait_observed(MACHINE, lambda s: s.generation_applied == 2)
        assert guest.phase is ObservedPhase.parked

        assert "released" in _agent_command(data_dir, "release")
        await control.wait_workload(
            MACHINE, "w-guest", lambda w: w.phase is ObservedPhase.running, within_s=WAIT_S
        )
        await _until_inventory(control, lambda at: at is None)
        assert "nothing changed" in _agent_command(data_dir, "release")
    finally:
        await agent.stop_workloads()
        await agent.stop()
        await nc.close()


async def _until_inventory(control: ControlPlane, check: Callable[[datetime | None], bool]) -> None:
    """Poll the machine's inventory on the bus until its `reclaimed_at` passes `check`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        with_reclaim = None
        try:
            inventory = await control.inventory(MACHINE)
        except (nats.errors.Error, TimeoutError):
            inventory = None
        if inventory is not None:
            with_reclaim = inventory.reclaimed_at
            if check(with_reclaim):
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the inventory's reclaimed_at never matched; last {with_reclaim}")
        await asyncio.sleep(0.05)
