"""A notebook on the process driver is a real Jupyter server: running once `/api/status`
answers with its token, refusing requests without it, and the token never on its command line,
in its environment or in its logs. Its Python is `workload_python` (under a root agent the
notebook runs as a user of its own, ADR-0007)."""

from __future__ import annotations

import secrets
from pathlib import Path

import psutil
import pytest

from einsora.agent.drivers import ProcessDriver
from einsora.agent.drivers.probe import http_status
from einsora.agent.workload_python import WorkloadPython
from einsora.common.schemas import ObservedPhase, Target, WorkloadKind
from einsora.testing.agent import ControlPlane, Processes, StartAgent


@pytest.mark.slow
async def test_notebook_runs_a_real_jupyter_that_needs_its_token(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    data_dir: Path,
    workload_python: WorkloadPython,
) -> None:
    agent = await start_agent(machine_id="m-nb", python=workload_python.path)
    token = secrets.token_urlsafe(24)
    notebook = control.workload("w-nb", kind=WorkloadKind.notebook, access_token=token)
    await control.put_desired("m-nb", 1, [notebook])
    seen = await control.wait_workload(
        "m-nb", "w-nb", lambda w: w.phase is ObservedPhase.running, within_s=90
    )
    pid = processes.track(seen.pid)
    assert seen.endpoint is not None
    host, port = seen.endpoint.host, seen.endpoint.port
    assert host == "127.0.0.1"

    assert await http_status(host, port, "/api/status", {"Authorization": f"token {token}"}) == 200
    assert await http_status(host, port, "/api/status") == 403
    assert await http_status(host, port, "/api/status", {"Authorization": "token wrong"}) == 403

    proc = psutil.Process(pid)
    assert token not in " ".join(proc.cmdline())
    assert all(token not in v for v in proc.environ().values())
    workdir = data_dir / "workloads" / "w-nb"
    for log in (workdir / "logs").iterdir():
        assert token not in log.read_text()
    assert isinstance(agent.driver, ProcessDriver)
    own = agent.driver.private_dir(workdir)  # `workdir` itself unless it has a user of its own
    assert (own / "jupyter" / "token").stat().st_mode & 0o077 == 0

    await control.put_desired("m-nb", 2, [notebook.model_copy(update={"target": Target.parked})])
    await control.wait_workload(
        "m-nb", "w-nb", lambda w: w.phase is ObservedPhase.parked, within_s=30
    )
    assert not processes.alive(pid)
    assert (own / "home").is_dir()
