"""Which drivers a machine may claim comes from the operator (issue 34, N9): `sim` runs nothing,
so a machine that reports it is placed on only in a cell whose operator allows sim machines
(`EINSORA_SIM_MACHINES`), and then every placement there says that nothing runs.

A real scheduler on a real bus; Sim plays the api (enrolments, intents) and the machine's agent
(an inventory with GPUs and the `sim` driver).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from einsora.common.isolation import DRIVER_ISOLATION, Isolation, has_strong_driver
from einsora.common.schemas import SharingLevel, WorkloadEvent
from einsora.common.settings import Settings
from einsora.common.testing import enrol

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

OWNER = "t-owner"
GUEST = "t-guest"


async def _shared_sim_machine(sim: Sim) -> None:
    """The owner's machine, shared with the guest's tenant, whose agent reports four L40S
    and the `sim` driver."""
    await enrol(
        sim.bus.js,
        "m-sim",
        owner_tenant_id=OWNER,
        sharing=SharingLevel.invite_only,
        guests=(GUEST,),
    )
    await sim.join("m-sim", enrolled=None, gpus=4)


async def _decided(sim: Sim, workload_id: str) -> WorkloadEvent:
    """Its first decision: placed, or queued."""
    return await sim.until(
        lambda: sim.event(workload_id, "scheduled") or sim.event(workload_id, "queued"),
        what=f"{workload_id} scheduled or queued",
    )


def test_sim_is_never_rated_strong_isolation_and_is_off_by_default() -> None:
    assert DRIVER_ISOLATION["sim"] is not Isolation.strong
    assert not has_strong_driver(["sim"])
    assert Settings().sim_machines is False


async def test_a_sim_machine_takes_no_work_in_a_cell_that_does_not_allow_sim(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="einsora.scheduler")
    await _shared_sim_machine(sim)
    await start_scheduler(sqlite_url, settings={"sim_machines": False})

    guests = await sim.launch(tenant_id=GUEST)
    decided = await _decided(sim, guests)
    assert decided.state.value == "queued", decided.reason
    assert sim.placed_on(guests) == []
    assert "m-sim: " in decided.reason
    assert "its sim driver is ignored: this cell does not allow sim machines" in decided.reason
    assert "EINSORA_SIM_MACHINES" in decided.reason

    # Not the owner's either: a machine's word that it runs workloads is not enough.
    owners = await sim.launch(tenant_id=OWNER)
    decided = await _decided(sim, owners)
    assert decided.state.value == "queued", decided.reason
    assert "its sim driver is ignored" in decided.reason
    assert sim.placed_on(owners) == []

    said = [
        r
        for r in caplog.records
        if getattr(r, "machine_id", None) == "m-sim" and "sim driver" in r.getMessage()
    ]
    assert len(said) == 1, [r.getMessage() for r in said]


async def test_where_sim_machines_are_allowed_the_placement_says_nothing_runs(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await _shared_sim_machine(sim)
    await start_scheduler(sqlite_url, settings={"sim_machines": True})

    guests = await sim.launch(tenant_id=GUEST)
    placed = await _decided(sim, guests)
    assert placed.state.value == "scheduled", placed.reason
    assert [m for m, _ in sim.placed_on(guests)] == ["m-sim"]
    assert "driver sim: nothing runs (a simulated machine)" in placed.reason
