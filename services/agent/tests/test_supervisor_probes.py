"""A running workload is not killed by one failed readiness probe, nor by a stall of the agent's
own event loop: the start timeout bounds `starting` only, and a running workload fails after
failed probes in a row over a window, each logged (issue 9, hole 4).

The supervisor runs here as the agent runs it, over the real process driver, with a real HTTP
server as the workload; the test makes its answers fail (a `fail` file in its home makes it
answer 503) or stalls the loop the supervisor runs on. Timings are short through parameters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

import pytest
import pytest_asyncio

from einsora.agent.converge import Goal
from einsora.agent.drivers import ProcessDriver, ProcessOptions
from einsora.agent.drivers.registry import DriverSet
from einsora.agent.records import RecordStore
from einsora.agent.supervisor import Timing, WorkloadSupervisor
from einsora.agent.workload_python import WorkloadPython
from einsora.common.schemas import ObservedPhase, WorkloadKind
from einsora.testing.agent import ControlPlane, Processes

# Each request is logged before its answer ("begin") and after it (its status), in its home.
SERVER = """
import http.server, os, time
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open("requests.log", "a") as f:
            f.write("begin\\n")
        time.sleep(float(os.environ.get("DELAY_S", "0")))
        status = 503 if os.path.exists("fail") else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
        with open("requests.log", "a") as f:
            f.write(f"{status}\\n")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""
TIMING = Timing(grace_s=2.0, start_timeout_s=0.5, probe_failures=3, probe_failure_window_s=1.0)
OPTIONS = ProcessOptions(poll_s=0.05, starting_poll_s=0.05, probe_timeout_s=1.0)
running, failed = ObservedPhase.running, ObservedPhase.failed


async def wait_for(what: str, check: Callable[[], bool], within_s: float = 30.0) -> None:
    """Until `check()` holds (polled; a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"never happened within {within_s:g} s: {what}"
        await asyncio.sleep(0.02)


class Workload:
    """One supervised server workload: its supervisor, the phases it reported, its files."""

    def __init__(
        self, tmp_path: Path, python: WorkloadPython, workload_id: str, script: str, delay_s: float
    ) -> None:
        self.driver = ProcessDriver(OPTIONS)
        self.workdir = tmp_path / "data" / "workloads" / workload_id
        self.records = RecordStore(tmp_path / "data" / "agent" / "m-probe" / "workloads")
        self.phases: list[ObservedPhase] = []
        self.desired = ControlPlane.workload(
            workload_id,
            kind=WorkloadKind.endpoint,
            spec={"command": [python.path, "-c", script], "env": {"DELAY_S": str(delay_s)}},
        )
        self.supervisor = self.supervise()

    def supervise(self) -> WorkloadSupervisor:
        sup = WorkloadSupervisor(
            self.desired.workload_id,
            drivers=DriverSet([self.driver], self.driver.name),
            workdir=self.workdir,
            records=self.records,
            on_change=lambda: self.phases.append(sup.phase),
            timing=TIMING,
        )
        return sup

    @property
    def home(self) -> Path:
        return self.driver.private_dir(self.workdir) / "home"

    def answers(self) -> list[str]:
        log = self.home / "requests.log"
        return log.read_text().split() if log.exists() else []

    def answered(self, status: str) -> int:
        return self.answers().count(status)

    async def run_until_older_than_the_start_timeout(self, processes: Processes) -> int:
        self.supervisor.retarget(Goal.run, self.desired)
        await wait_for("running", lambda: self.supervisor.phase is running)
        since = time.monotonic()
        await wait_for(
            "older than the start timeout",
            lambda: time.monotonic() - since > 2 * TIMING.start_timeout_s,
        )
        assert self.supervisor.handle is not None
        return processes.track(self.supervisor.handle.pid)

    async def fail_one_probe(self, caplog: pytest.LogCaptureFixture) -> None:
        """Make its answers fail until one probe got a 503, then answer again; return once
        the supervisor saw a probe answer again."""
        (self.home / "fail").touch()
        await wait_for("a probe answered 503", lambda: self.answered("503") >= 1)
        (self.home / "fail").unlink()
        await wait_for(
            "the probe answering again",
            lambda: any(
                r.getMessage() == "readiness probe answers again"
                and getattr(r, "workload", "") == self.desired.workload_id
                for r in caplog.records
            ),
        )


class MakeWorkload(Protocol):
    def __call__(self, workload_id: str, script: str = ..., delay_s: float = ...) -> Workload: ...


@pytest_asyncio.fixture
async def workloads(tmp_path: Path, workload_python: WorkloadPython) -> AsyncIterator[MakeWorkload]:
    made: list[Workload] = []

    def make(workload_id: str, script: str = SERVER, delay_s: float = 0.0) -> Workload:
        made.append(Workload(tmp_path, workload_python, workload_id, script, delay_s))
        return made[-1]

    yield make
    for w in made:  # removed: stopped, and its files (its private directory too) deleted
        w.supervisor.retarget(Goal.remove, None)
        await w.supervisor.settled()
        await w.supervisor.close()


def failed_probes(caplog: pytest.LogCaptureFixture, workload_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage() == "readiness probe failed" and getattr(r, "workload", "") == workload_id
    ]


async def test_a_running_workload_survives_a_failed_probe(
    workloads: MakeWorkload, processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="einsora.agent")
    w = workloads("w-blip")
    pid = await w.run_until_older_than_the_start_timeout(processes)

    await w.fail_one_probe(caplog)

    assert w.supervisor.phase is running
    assert failed not in w.phases
    assert processes.alive(pid)
    [logged] = failed_probes(caplog, "w-blip")[:1]
    assert logged.attempt == 1  # type: ignore[attr-defined]
    assert "answered 503" in logged.reason  # type: ignore[attr-defined]


async def test_a_stalled_agent_loop_is_not_the_workloads_failure(
    workloads: MakeWorkload, processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="einsora.agent")
    w = workloads("w-stall", delay_s=0.3)  # each answer takes a while: probes in flight
    pid = await w.run_until_older_than_the_start_timeout(processes)

    def in_flight() -> bool:
        answers = w.answers()
        return answers.count("begin") > len(answers) - answers.count("begin")

    await wait_for("a probe in flight", in_flight)
    # The agent's loop stalls for longer than the probe's timeout and the failure window.
    time.sleep(3 * OPTIONS.probe_timeout_s)  # noqa: ASYNC251 (the stall under test)
    answered = w.answered("200")
    await wait_for("two more probes answered", lambda: w.answered("200") >= answered + 2)

    assert w.supervisor.phase is running
    assert failed not in w.phases
    assert processes.alive(pid)
    assert failed_probes(caplog, "w-stall") == []


async def test_failed_probes_in_a_row_fail_a_running_workload_with_the_reason(
    workloads: MakeWorkload, processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="einsora.agent")
    w = workloads("w-down")
    pid = await w.run_until_older_than_the_start_timeout(processes)

    (w.home / "fail").touch()
    await wait_for("failed", lambda: w.supervisor.phase is failed)

    logged = failed_probes(caplog, "w-down")
    attempts = [r.attempt for r in logged]  # type: ignore[attr-defined]
    assert len(attempts) >= TIMING.probe_failures
    assert attempts == list(range(1, len(attempts) + 1))
    assert all("GET / answered 503" in r.reason for r in logged)  # type: ignore[attr-defined]
    reason = w.supervisor.reason
    assert reason.startswith(f"its readiness probe failed {len(attempts)} times in a row over ")
    assert "(last: GET / answered 503, not below 500); stopped" in reason
    assert not processes.alive(pid)


async def test_a_workload_never_ready_fails_after_the_start_timeout(
    workloads: MakeWorkload, processes: Processes
) -> None:
    w = workloads("w-mute", script="import time; time.sleep(60)")  # listens on no port
    w.supervisor.retarget(Goal.run, w.desired)
    await wait_for("failed", lambda: w.supervisor.phase is failed)

    assert w.supervisor.reason.startswith("not ready after 0.5 s: its readiness probe never")
    assert "connection refused on port" in w.supervisor.reason
    assert running not in w.phases


async def test_after_an_agent_restart_a_running_workload_still_survives_a_failed_probe(
    workloads: MakeWorkload, processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="einsora.agent")
    w = workloads("w-adopted")
    pid = await w.run_until_older_than_the_start_timeout(processes)
    await w.supervisor.close()  # the agent stops; its workload keeps running

    adoption = await w.driver.adopt(w.records.load_all()["w-adopted"])
    assert adoption.handle is not None
    assert adoption.handle.ready  # its record says it was running
    w.phases.clear()
    w.supervisor = w.supervise()
    w.supervisor.adopt(adoption.handle, w.driver)
    since = time.monotonic()
    w.supervisor.retarget(Goal.run, w.desired)
    await wait_for(
        "adopted longer ago than the start timeout",
        lambda: time.monotonic() - since > 2 * TIMING.start_timeout_s,
    )
    await w.fail_one_probe(caplog)

    assert w.supervisor.phase is running
    assert failed not in w.phases
    assert w.supervisor.handle is not None
    assert w.supervisor.handle.pid == pid
