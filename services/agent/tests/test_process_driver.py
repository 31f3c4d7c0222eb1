"""The process driver through the agent: real local processes, their logs, park and remove,
failures with reasons, and re-adoption by a restarted agent (in-process). The workloads' Python
is `workload_python`: under a root agent they run as users of their own (ADR-0007)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from einsora.agent.drivers import ProcessDriver
from einsora.agent.drivers.probe import http_status
from einsora.agent.workload_python import WorkloadPython
from einsora.common.schemas import DesiredWorkload, ObservedPhase, Target, WorkloadKind
from einsora.testing.agent import ControlPlane, Processes, StartAgent

running, failed = ObservedPhase.running, ObservedPhase.failed


def endpoint(
    control: ControlPlane, workload_id: str, command: list[str], **spec: object
) -> DesiredWorkload:
    return control.workload(
        workload_id, kind=WorkloadKind.endpoint, spec={"command": command, **spec}
    )


async def test_endpoint_runs_answers_parks_and_is_removed(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
    data_dir: Path,
) -> None:
    agent = await start_agent(machine_id="m-p1")
    web = endpoint(control, "w-web", workload_python.http_server())
    await control.put_desired("m-p1", 1, [web])
    seen = await control.wait_workload("m-p1", "w-web", lambda w: w.phase is running)
    pid = processes.track(seen.pid)
    assert seen.endpoint is not None
    assert seen.endpoint.host == "127.0.0.1"
    assert await http_status("127.0.0.1", seen.endpoint.port, "/") == 200
    workdir = data_dir / "workloads" / "w-web"
    assert (workdir / "logs" / "stderr.log").exists()
    assert isinstance(agent.driver, ProcessDriver)
    own = agent.driver.private_dir(workdir)  # `workdir` itself unless it has a user of its own
    (own / "home" / "notes.txt").write_text("kept while parked")

    await control.put_desired("m-p1", 2, [web.model_copy(update={"target": Target.parked})])
    parked = await control.wait_workload("m-p1", "w-web", lambda w: w.phase is ObservedPhase.parked)
    assert parked.pid is None
    assert not processes.alive(pid)
    assert (own / "home" / "notes.txt").read_text() == "kept while parked"

    await control.put_desired("m-p1", 3, [web.model_copy(update={"target": Target.removed})])
    await control.wait_workload("m-p1", "w-web", lambda w: w.phase is ObservedPhase.removed)
    assert not workdir.exists()
    assert not own.exists()


async def test_resume_after_park_starts_a_new_process(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    await start_agent(machine_id="m-p2")
    web = endpoint(control, "w-re", workload_python.http_server())
    await control.put_desired("m-p2", 1, [web])
    first = await control.wait_workload("m-p2", "w-re", lambda w: w.phase is running)
    processes.track(first.pid)
    parked = web.model_copy(update={"target": Target.parked})
    await control.put_desired("m-p2", 2, [parked])
    await control.wait_workload("m-p2", "w-re", lambda w: w.phase is ObservedPhase.parked)
    await control.put_desired("m-p2", 3, [web])
    second = await control.wait_workload(
        "m-p2", "w-re", lambda w: w.phase is running and w.pid != first.pid
    )
    processes.track(second.pid)


async def test_a_process_that_exits_fails_with_its_reason(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    await start_agent(machine_id="m-p3")
    crash = [
        workload_python.path,
        "-c",
        "import sys; print('model file not found: /m.gguf', file=sys.stderr); sys.exit(3)",
    ]
    await control.put_desired(
        "m-p3",
        1,
        [
            endpoint(control, "w-crash", crash),
            endpoint(control, "w-missing", ["no-such-command-einsora", "$PORT"]),
            control.workload("w-nocmd", kind=WorkloadKind.endpoint, spec={}),
            control.workload("w-vm", kind=WorkloadKind.vm),
            control.workload("w-tok", kind=WorkloadKind.notebook),
        ],
    )
    state = await control.wait_observed(
        "m-p3", lambda s: len(s.workloads) == 5 and all(w.phase is failed for w in s.workloads)
    )
    reasons = {w.workload_id: w.reason for w in state.workloads}
    assert reasons["w-crash"].startswith("exited with code 3")
    assert "model file not found: /m.gguf" in reasons["w-crash"]
    assert "exited with code 127" in reasons["w-missing"]
    assert "no-such-command-einsora" in reasons["w-missing"]
    assert "spec.command" in reasons["w-nocmd"]
    assert "cannot run a vm" in reasons["w-vm"]
    assert "access token" in reasons["w-tok"]
    # A failed workload is not restarted while its target stays `running`.
    await control.put_desired("m-p3", 2, [endpoint(control, "w-crash", crash)])
    state = await control.wait_observed("m-p3", lambda s: s.generation_applied == 2)
    crashed = next(w for w in state.workloads if w.workload_id == "w-crash")
    assert crashed.phase is failed


async def test_a_killed_process_fails_with_the_signal(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    await start_agent(machine_id="m-p4")
    await control.put_desired("m-p4", 1, [endpoint(control, "w-k", workload_python.http_server())])
    seen = await control.wait_workload("m-p4", "w-k", lambda w: w.phase is running)
    os.kill(processes.track(seen.pid), signal.SIGKILL)
    dead = await control.wait_workload("m-p4", "w-k", lambda w: w.phase is failed)
    assert dead.reason.startswith("killed by signal 9 (SIGKILL)")


async def test_a_workload_not_in_desired_state_is_stopped_and_its_dir_kept(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
    data_dir: Path,
) -> None:
    await start_agent(machine_id="m-p5")
    await control.put_desired(
        "m-p5", 1, [endpoint(control, "w-gone", workload_python.http_server())]
    )
    seen = await control.wait_workload("m-p5", "w-gone", lambda w: w.phase is running)
    pid = processes.track(seen.pid)
    await control.put_desired("m-p5", 2, [])
    removed = await control.wait_workload(
        "m-p5", "w-gone", lambda w: w.phase is ObservedPhase.removed
    )
    assert "not in the desired state" in removed.reason
    assert not processes.alive(pid)
    assert (data_dir / "workloads" / "w-gone").is_dir()


async def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    await start_agent(machine_id="m-p6", grace_s=0.5)
    stubborn = [
        workload_python.path,
        "-c",
        "import signal, socket, os; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "s = socket.socket(); s.bind(('127.0.0.1', int(os.environ['PORT']))); s.listen(); "
        "[s.accept()[0].close() for _ in iter(int, 1)]",
    ]
    await control.put_desired("m-p6", 1, [endpoint(control, "w-st", stubborn, readiness="tcp")])
    seen = await control.wait_workload("m-p6", "w-st", lambda w: w.phase is running)
    pid = processes.track(seen.pid)
    await control.put_desired("m-p6", 2, [])
    await control.wait_workload("m-p6", "w-st", lambda w: w.phase is ObservedPhase.removed)
    assert not processes.alive(pid)


async def test_agent_stop_leaves_workloads_running_and_a_new_agent_adopts_them(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    first = await start_agent(machine_id="m-p7")
    await control.put_desired(
        "m-p7",
        1,
        [
            endpoint(control, "w-stay", workload_python.http_server()),
            endpoint(control, "w-go", workload_python.http_server()),
        ],
    )
    state = await control.wait_observed(
        "m-p7", lambda s: len(s.workloads) == 2 and all(w.phase is running for w in s.workloads)
    )
    before = {w.workload_id: w for w in state.workloads}
    stay, go = processes.track(before["w-stay"].pid), processes.track(before["w-go"].pid)
    assert first.running_count() == 2
    await first.stop()
    assert processes.alive(stay)
    assert processes.alive(go)

    # While no agent runs, the scheduler stops wanting w-go.
    await control.put_desired(
        "m-p7", 2, [endpoint(control, "w-stay", workload_python.http_server())]
    )
    await start_agent(machine_id="m-p7")
    state = await control.wait_observed(
        "m-p7",
        lambda s: (
            s.generation_applied == 2
            and {w.workload_id: w.phase for w in s.workloads}
            == {"w-stay": running, "w-go": ObservedPhase.removed}
        ),
    )
    after = next(w for w in state.workloads if w.workload_id == "w-stay")
    assert after.pid == stay
    assert after.started_at == before["w-stay"].started_at
    assert after.endpoint == before["w-stay"].endpoint
    assert not processes.alive(go)
