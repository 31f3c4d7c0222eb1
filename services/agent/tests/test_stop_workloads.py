"""`stop_workloads` stops every workload and is final: a desired state the agent reads while it
stops them, or after (a re-read after a reconnect, a periodic resync), starts nothing again.

A CI run of `test_fence` waited on such a stop for good: the agent re-read the desired state
(all running) in the middle of it, forgot a supervisor the stop waited on, and started the
others again. The agent is the real one, in-process; the workloads are real processes.
"""

from __future__ import annotations

import asyncio

from einsora.agent.workload_python import WorkloadPython
from einsora.common.schemas import DesiredWorkload, ObservedPhase
from einsora.common.schemas import WorkloadKind as Kind
from einsora.testing.agent import ControlPlane, Processes, StartAgent

MACHINE = "m-stop"
STOP_S = 30.0


async def test_a_desired_state_read_during_the_stop_starts_nothing_again(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    agent = await start_agent(machine_id=MACHINE, python=workload_python.path)
    web = workload_python.http_server()
    desired: list[DesiredWorkload] = [
        ControlPlane.workload(wid, kind=Kind.endpoint, spec={"command": web})
        for wid in ("w-a", "w-b", "w-c")
    ]
    await control.put_desired(MACHINE, 1, desired)
    state = await control.wait_observed(
        MACHINE,
        lambda s: (
            len(s.workloads) == 3 and all(w.phase is ObservedPhase.running for w in s.workloads)
        ),
        within_s=30,
    )
    pids = [processes.track(w.pid) for w in state.workloads]

    stopping = asyncio.create_task(agent.stop_workloads())
    await asyncio.sleep(0)  # the stop has given every workload its goal, and waits
    # The same wish, newer, as the scheduler or a re-read after a reconnect would bring it:
    # read by the watch, and by the re-read itself while the stop runs.
    await control.put_desired(MACHINE, 2, desired)
    for machine in agent.machines.values():
        await machine.resync()
    await asyncio.wait_for(stopping, STOP_S)
    assert agent.running_count() == 0
    assert not any(processes.alive(pid) for pid in pids)

    # Read after the stop too: the agent still starts nothing.
    await control.put_desired(MACHINE, 3, desired)
    for machine in agent.machines.values():  # the read itself, not a wait for the watch
        await machine.resync()
    assert agent.running_count() == 0
    assert agent.unsettled() == []
