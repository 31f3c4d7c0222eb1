"""A machine invitation that names a user (issue 15), decided by a real scheduler on a real bus.

The user's workloads are guests there whatever tenant they launch in; a tenant-mate's are not.
Who launched a workload is stored with it, so a restarted scheduler still knows that the
user's running workload may stay, and preempts it only once the invitation is revoked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import Enrolment, SharingLevel

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

OWNER = "t-alice"
STUDIO = "t-studio"


async def _enrol(sim: Sim, guest_users: list[str]) -> None:
    """Alice's machine, shared with the users named; no grace and no minimum runtime."""
    enrolment = Enrolment(
        machine_id="m-1",
        owner_tenant_id=OWNER,
        region="local",
        sharing=SharingLevel.invite_only,
        guest_users=guest_users,
        reclaim_grace_s=0,
        guest_min_runtime_s=0,
    )
    kv = bind_bucket(sim.bus.js, names.ENROLMENTS)
    await kv.put(names.enrolment_key("m-1"), enrolment.to_bytes())


async def test_an_invited_users_workload_runs_and_survives_a_restart_until_revoked(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await _enrol(sim, ["u-ada"])
    await sim.join("m-1", enrolled=None, gpus=2)
    scheduler = await start_scheduler(sqlite_url)

    mate = await sim.launch(tenant_id=STUDIO, user_id="u-bo")
    queued = await sim.wait_state(mate, "queued")
    assert "m-1: not shared with your tenant or you" in queued.reason
    hers = await sim.launch(tenant_id=STUDIO, user_id="u-ada")
    await sim.wait_state(hers, "scheduled")
    assert [m for m, _ in sim.placed_on(hers)] == ["m-1"]
    await sim.report("m-1", {hers: "running"})
    await sim.wait_state(hers, "running")

    # A restarted scheduler reads who launched it from its store: she may stay. The owner's
    # launch being placed shows the new scheduler has judged the machine's guests meanwhile.
    await scheduler.stop()
    await start_scheduler(sqlite_url)
    own = await sim.launch(tenant_id=OWNER)
    await sim.wait_state(own, "scheduled")
    await sim.report("m-1", {hers: "running", own: "running"})
    await sim.wait_state(own, "running")
    assert sim.state(hers) == "running"
    assert sim.state(mate) == "queued"

    # Revoked: her workload is preempted (no grace, no minimum runtime here).
    await _enrol(sim, [])
    preempted = await sim.wait_state(hers, "preempted")
    assert "no longer shared" in preempted.reason
    assert sim.state(own) == "running"
