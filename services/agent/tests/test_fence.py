"""A machine cut off from the bus fences itself (ADR-0029): after `agent_fence_after_s` without
an acknowledged write, it stops the workloads the control plane may run elsewhere, keeps the
others, and once the bus is back its observed state says what it stopped and why.

The bus really goes away (the test's own nats-server is stopped), the workloads are real
processes, and the agent is the real one, in-process.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from einsora.agent.fence import Contact, fence_reason, stops_when_cut_off
from einsora.agent.service import AgentService
from einsora.agent.workload_python import WorkloadPython
from einsora.common.bus import bind_bucket, close_quietly, connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import DesiredWorkload, ObservedPhase, ObservedState, Target
from einsora.common.schemas import WorkloadKind as Kind
from einsora.common.settings import Settings
from einsora.testing.agent import ControlPlane, Processes

FENCE_S = 2.0
HEARTBEAT_S = 0.5
REASON = "stopped by its agent after 2 s without the control plane (it may run elsewhere now)"


def _entry(workload_id: str, web: list[str], **fields: object) -> DesiredWorkload:
    spec: dict[str, object] = {"command": web}
    if "disconnect" in fields:
        spec["disconnect"] = fields.pop("disconnect")
    return ControlPlane.workload(workload_id, kind=Kind.endpoint, spec=spec).model_copy(
        update=fields
    )


def _phases(state: ObservedState) -> dict[str, ObservedPhase]:
    return {w.workload_id: w.phase for w in state.workloads}


async def test_a_machine_cut_off_stops_what_may_run_elsewhere_and_says_so(
    own_nats_server: EmbeddedNats,
    data_dir: Path,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    nc = await connect(own_nats_server.url, name="test-scheduler")
    await provision(nc.jetstream())
    control = ControlPlane(nc, bind_bucket(nc.jetstream(), names.MACHINES))
    agent = AgentService(
        Settings(nats_url=own_nats_server.url, data_dir=data_dir, agent_fence_after_s=FENCE_S),
        machine_id="m-cut",
        heartbeat_s=HEARTBEAT_S,
        poll_s=0.2,
        grace_s=2.0,
    )
    await agent.start()
    web = workload_python.http_server()
    desired = [
        _entry("w-moves", web, replaceable=True),  # a fallback chain or a replica: on
        _entry("w-stays", web),  # placed nowhere else: off
        _entry("w-kept", web, replaceable=True, disconnect="keep"),  # its owner's opt-out
        _entry("w-stops", web, disconnect="stop"),  # its owner's opt-in
    ]
    try:
        await control.put_desired("m-cut", 1, desired)
        state = await control.wait_observed(
            "m-cut",
            lambda s: (
                len(s.workloads) == 4 and all(w.phase is ObservedPhase.running for w in s.workloads)
            ),
            within_s=30,
        )
        pids = {w.workload_id: processes.track(w.pid) for w in state.workloads}

        # Connected, nothing is fenced however long it runs: wait for heartbeats spanning
        # twice the fence time, every one saying all four run.
        writes = await control.record("m-cut")
        began = time.monotonic()
        await control.wait_observed(
            "m-cut", lambda s: time.monotonic() - began > 2 * FENCE_S, within_s=10
        )
        assert writes(), "heartbeats while connected"
        assert all(set(_phases(s).values()) == {ObservedPhase.running} for s in writes())

        # The bus goes away: those the control plane may place elsewhere are stopped.
        # Timed from before the server is asked to stop: a JetStream server's shutdown takes a
        # while, and the agent hears nothing from it meanwhile.
        cut_at = time.monotonic()
        await close_quietly(nc)
        own_nats_server.stop()
        deadline = cut_at + FENCE_S + 15
        while processes.alive(pids["w-moves"]) or processes.alive(pids["w-stops"]):
            assert time.monotonic() < deadline, "the fenced workloads still run"
            await asyncio.sleep(0.05)  # a look at the processes every 50 ms, until the deadline
        # Timed from its last acknowledged write: sent at most a heartbeat before the cut, and
        # a heartbeat may itself be late by as much on a busy host, but never the fence time.
        assert time.monotonic() - cut_at >= FENCE_S - 2 * HEARTBEAT_S
        assert processes.alive(pids["w-stays"])
        assert processes.alive(pids["w-kept"])

        # The bus is back: the observed state says what the agent stopped, and why.
        own_nats_server.start()
        nc = await connect(own_nats_server.url, name="test-scheduler")
        control = ControlPlane(nc, bind_bucket(nc.jetstream(), names.MACHINES))
        state = await control.wait_observed(
            "m-cut",
            lambda s: (
                _phases(s).get("w-moves") is ObservedPhase.failed
                and _phases(s).get("w-stops") is ObservedPhase.failed
            ),
            within_s=30,
        )
        seen = {w.workload_id: w for w in state.workloads}
        assert seen["w-moves"].reason == REASON
        assert seen["w-stops"].reason == REASON
        assert (seen["w-stays"].phase, seen["w-stays"].pid) == (
            ObservedPhase.running,
            pids["w-stays"],
        )
        assert (seen["w-kept"].phase, seen["w-kept"].pid) == (
            ObservedPhase.running,
            pids["w-kept"],
        )

        # The same wish again starts nothing: only the control plane's next word does. The
        # machine's loss parks it there (the fence's account stays), and a resume starts it.
        await control.put_desired("m-cut", 2, desired)
        state = await control.wait_observed("m-cut", lambda s: s.generation_applied == 2)
        assert _phases(state)["w-moves"] is ObservedPhase.failed
        parked = [*desired[1:], desired[0].model_copy(update={"target": Target.parked})]
        await control.put_desired("m-cut", 3, parked)
        state = await control.wait_observed("m-cut", lambda s: s.generation_applied == 3)
        moves = next(w for w in state.workloads if w.workload_id == "w-moves")
        assert (moves.phase, moves.reason) == (ObservedPhase.failed, REASON)
        await control.put_desired("m-cut", 4, desired)
        again = await control.wait_workload(
            "m-cut", "w-moves", lambda w: w.phase is ObservedPhase.running, within_s=30
        )
        assert again.pid != pids["w-moves"]
        processes.track(again.pid)
    finally:
        await agent.stop_workloads()
        await agent.stop()
        await close_quietly(nc)


def test_who_is_stopped_when_cut_off() -> None:
    """On by default for what the control plane may place elsewhere; the spec says otherwise."""

    def entry(replaceable: bool, spec: dict[str, object]) -> DesiredWorkload:
        return ControlPlane.workload("w-1", spec=spec).model_copy(
            update={"replaceable": replaceable}
        )

    assert stops_when_cut_off(entry(True, {}))
    assert not stops_when_cut_off(entry(False, {}))
    assert stops_when_cut_off(entry(False, {"disconnect": "stop"}))
    assert not stops_when_cut_off(entry(True, {"disconnect": "keep"}))
    assert stops_when_cut_off(entry(True, {"disconnect": "nonsense"}))  # the default stands
    assert fence_reason(90.0) == (
        "stopped by its agent after 90 s without the control plane (it may run elsewhere now)"
    )


def test_the_fence_is_timed_from_the_last_acknowledged_write() -> None:
    """Monotonic seconds since the last exchange that the server acknowledged: a wall clock
    that jumps changes nothing, and 0 turns the fence off."""
    contact = Contact(fence_after_s=10.0, last=100.0)
    assert contact.cut_off_for(109.9) is None
    assert contact.cut_off_for(110.0) == 10.0
    contact.heard(at=105.0)
    assert contact.cut_off_for(110.0) is None
    assert contact.cut_off_for(115.5) == 10.5
    contact.heard(at=101.0)  # an acknowledgement older than one already counted
    assert contact.cut_off_for(114.0) is None
    assert Contact(fence_after_s=0.0, last=0.0).cut_off_for(1e9) is None


def test_the_setting_turns_the_fence_off_and_on(data_dir: Path) -> None:
    assert Settings(data_dir=data_dir).agent_fence_after_s == 90.0
    agent = AgentService(Settings(data_dir=data_dir, agent_fence_after_s=0), driver="sim")
    assert agent.fence_after_s == 0.0
