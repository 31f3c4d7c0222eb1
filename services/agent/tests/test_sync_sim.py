"""The agent's sync, on the sim driver: desired state in, observed state and inventory out.

The test plays the scheduler: it writes `<m>.desired` and reads `<m>.observed` and
`<m>.inventory` from the real bus.
"""

from __future__ import annotations

from einsora.common.schemas import ObservedPhase, Target
from einsora.testing.agent import ControlPlane, StartAgent

running = ObservedPhase.running


async def test_sim_launch_runs_and_reports_inventory(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    agent = await start_agent(
        machine_id="m-sim1", driver="sim", sim_inventory="4x l40s-48gb, 64 cpu, 512 GiB"
    )
    assert agent.machine_ids == ["m-sim1"]
    inv = await control.inventory("m-sim1")
    assert inv is not None
    assert (len(inv.gpus), inv.cpus, inv.drivers) == (4, 64, ["sim"])

    await control.put_desired("m-sim1", 1, [control.workload("w-1")])
    seen = await control.wait_workload("m-sim1", "w-1", lambda w: w.phase is running)
    assert seen.started_at is not None
    state = await control.observed("m-sim1")
    assert state is not None
    assert state.generation_applied == 1


async def test_a_new_machine_reports_generation_0_before_any_desired_state(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    await start_agent(machine_id="m-fresh", driver="sim")
    state = await control.wait_observed("m-fresh", lambda s: True)
    assert (state.generation_applied, state.workloads) == (0, [])


async def test_heartbeat_rewrites_observed_state(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    writes = await control.record("m-beat")
    await start_agent(machine_id="m-beat", driver="sim", heartbeat_s=0.2)
    await control.wait_observed("m-beat", lambda s: len(writes()) >= 4, within_s=5)
    beats = [s.heartbeat_at for s in writes()]
    assert beats == sorted(beats)
    assert len(set(beats)) == len(beats)


async def test_start_delay_then_running_and_injected_failure(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    writes = await control.record("m-sim2")
    await start_agent(machine_id="m-sim2", driver="sim")
    await control.put_desired(
        "m-sim2",
        1,
        [
            control.workload("w-slow", spec={"sim": {"start_delay_s": 0.3}}),
            control.workload("w-bad", spec={"sim": {"fail": "CUDA out of memory"}}),
            control.workload("w-badspec", spec={"sim": {"start_delay_s": "soon"}}),
        ],
    )
    slow = await control.wait_workload("m-sim2", "w-slow", lambda w: w.phase is running)
    assert slow.phase is running
    bad = await control.wait_workload("m-sim2", "w-bad", lambda w: w.phase is ObservedPhase.failed)
    assert bad.reason == "CUDA out of memory"
    badspec = await control.wait_workload(
        "m-sim2", "w-badspec", lambda w: w.phase is ObservedPhase.failed
    )
    assert "start_delay_s must be a number" in badspec.reason
    phases = [w.phase for s in writes() for w in s.workloads if w.workload_id == "w-slow"]
    assert phases[0] is ObservedPhase.starting
    assert phases[-1] is running


async def test_park_remove_and_unlisted(control: ControlPlane, start_agent: StartAgent) -> None:
    await start_agent(machine_id="m-sim3", driver="sim")
    await control.put_desired("m-sim3", 1, [control.workload("w-a"), control.workload("w-b")])
    await control.wait_observed(
        "m-sim3", lambda s: len(s.workloads) == 2 and all(w.phase is running for w in s.workloads)
    )
    await control.put_desired(
        "m-sim3", 2, [control.workload("w-a", Target.parked), control.workload("w-c")]
    )
    state = await control.wait_observed(
        "m-sim3",
        lambda s: (
            {w.workload_id: w.phase for w in s.workloads}
            == {"w-a": ObservedPhase.parked, "w-b": ObservedPhase.removed, "w-c": running}
        ),
    )
    assert state.generation_applied == 2
    dropped = next(w for w in state.workloads if w.workload_id == "w-b")
    assert "not in the desired state" in dropped.reason
    # Reported removed once, a dropped workload is forgotten at the next generation.
    await control.put_desired(
        "m-sim3",
        3,
        [control.workload("w-a", Target.running), control.workload("w-c", Target.removed)],
    )
    await control.wait_observed(
        "m-sim3",
        lambda s: (
            s.generation_applied == 3
            and {w.workload_id: w.phase for w in s.workloads}
            == {"w-a": running, "w-c": ObservedPhase.removed}
        ),
    )


async def test_a_lower_generation_is_never_acted_on(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    writes = await control.record("m-sim4")
    await start_agent(machine_id="m-sim4", driver="sim")
    await control.put_desired("m-sim4", 5, [control.workload("w-keep")])
    await control.wait_workload("m-sim4", "w-keep", lambda w: w.phase is running)
    # A stale writer puts generation 3, which would stop w-keep and start w-stale.
    await control.put_desired("m-sim4", 3, [control.workload("w-stale")])
    await control.put_desired("m-sim4", 6, [control.workload("w-keep"), control.workload("w-new")])
    await control.wait_observed(
        "m-sim4",
        lambda s: (
            s.generation_applied == 6
            and {w.workload_id: w.phase for w in s.workloads}
            == {"w-keep": running, "w-new": running}
        ),
    )
    # The watch delivers in order, so generation 3 was seen before 6: it changed nothing.
    for state in writes():
        assert state.generation_applied != 3
        assert all(w.workload_id != "w-stale" for w in state.workloads)
        assert all(
            w.phase is not ObservedPhase.removed
            for w in state.workloads
            if w.workload_id == "w-keep"
        )


async def test_a_lower_generation_found_at_start_is_ignored_until_a_newer_one(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    await start_agent(machine_id="m-sim5", driver="sim")
    await control.put_desired("m-sim5", 7, [control.workload("w-a")])
    await control.wait_workload("m-sim5", "w-a", lambda w: w.phase is running)
    await control.put_desired("m-sim5", 2, [])  # stale; the agent re-reads and finds it again
    await control.put_desired("m-sim5", 8, [control.workload("w-a"), control.workload("w-b")])
    state = await control.wait_observed("m-sim5", lambda s: s.generation_applied == 8)
    assert {w.workload_id for w in state.workloads} >= {"w-a", "w-b"}


async def test_invalid_desired_values_change_nothing(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    await start_agent(machine_id="m-sim6", driver="sim")
    await control.put_desired("m-sim6", 1, [control.workload("w-a")])
    await control.wait_workload("m-sim6", "w-a", lambda w: w.phase is running)
    await control.kv.put("m-sim6.desired", b"{not json")
    await control.put_desired("m-other", 9, [])
    await control.put_desired("m-sim6", 2, [control.workload("w-a"), control.workload("../../etc")])
    state = await control.wait_observed("m-sim6", lambda s: s.generation_applied == 2)
    phases = {w.workload_id: w.phase for w in state.workloads}
    assert phases == {"w-a": running, "../../etc": ObservedPhase.failed}


async def test_many_sim_machines_share_one_process(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    agent = await start_agent(
        machine_id="m-many", driver="sim", sim_machines=5, sim_inventory="2x l4-24gb"
    )
    assert agent.machine_ids == [f"m-many-000{i}" for i in range(1, 6)]
    for machine_id in agent.machine_ids:
        inv = await control.inventory(machine_id)
        assert inv is not None
        assert inv.machine_id == machine_id
        assert len(inv.gpus) == 2
    uuids = [g.uuid for m in agent.machine_ids for g in (await control.inventory(m)).gpus]  # type: ignore[union-attr]
    assert len(set(uuids)) == 10
    await control.put_desired("m-many-0003", 1, [control.workload("w-3")])
    await control.wait_workload("m-many-0003", "w-3", lambda w: w.phase is running)
    for machine_id in ("m-many-0001", "m-many-0002", "m-many-0004", "m-many-0005"):
        state = await control.observed(machine_id)
        assert state is not None
        assert state.workloads == []


async def test_sim_fail_rate_fails_starts(control: ControlPlane, start_agent: StartAgent) -> None:
    await start_agent(machine_id="m-sim7", driver="sim", sim_fail_rate=1.0)
    await control.put_desired("m-sim7", 1, [control.workload("w-x")])
    seen = await control.wait_workload("m-sim7", "w-x", lambda w: w.phase is ObservedPhase.failed)
    assert "injected failure" in seen.reason
