"""Under a root agent, process workloads run as unprivileged users of their own (issue 9, hole 3;
ADR-0007): a workload cannot read the agent's data dir, nor another workload's token file or
private directory; its files are its own; two workloads get two uids; an adopted workload keeps
its uid across an agent restart; and a program, or a data dir, that breaks this is refused with
the path named.

The workloads try for themselves: `SPY` is an endpoint that tries to read what it is given,
writes what it saw into its home, then serves. The data dir's parent here is open to all (as
/var/lib is), so only the data dir's own mode and the workloads' uids keep them out.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from einsora.agent.drivers import ProcessDriver, isolation
from einsora.agent.workload_python import WorkloadPython
from einsora.common.schemas import DesiredWorkload, ObservedPhase, Target, WorkloadKind
from einsora.testing.agent import ControlPlane, Processes, StartAgent, open_directory

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="workloads run as users of their own only under a root agent"
)

SPY = r"""
import http.server, json, os, time
report = {
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "home": os.environ["HOME"],
    "user": os.environ["USER"], "cwd": os.getcwd(), "tries": {},
}
for path in os.environ["TRY"].split(os.pathsep):
    try:
        if os.path.isdir(path):
            seen = f"listed {len(os.listdir(path))} entries"
        else:
            with open(path, "rb") as f:
                seen = f"read {len(f.read())} bytes"
    except OSError as exc:
        seen = type(exc).__name__
    report["tries"][path] = seen
with open("mine.txt", "w") as f:
    f.write("mine")
if os.fork() == 0:  # a daemon that leaves the workload's session: it must not outlive it
    os.setsid()
    if os.fork() == 0:
        with open("daemon.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename("daemon.tmp", "daemon.pid")
        os.execvp("sleep", ["sleep", "600"])
    os._exit(0)
os.wait()
while not os.path.exists("daemon.pid"):
    time.sleep(0.01)
with open("report.json", "w") as f:
    json.dump(report, f)
address = ("127.0.0.1", int(os.environ["PORT"]))
http.server.HTTPServer(address, http.server.BaseHTTPRequestHandler).serve_forever()
"""
running = ObservedPhase.running


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A directory anyone may enter (like /var/lib), to hold a data dir; deleted after."""
    with open_directory("einsora-isolation-") as path:
        yield path


def private_data_dir(parent: Path) -> Path:
    data = parent / "data"
    data.mkdir(mode=0o700)
    (data / "einsora.db").write_text("what the control plane keeps")
    (data / "einsora.db").chmod(0o644)  # readable by all, were the data dir open
    return data


def spy(control: ControlPlane, python: WorkloadPython, tries: list[Path]) -> DesiredWorkload:
    return control.workload(
        "w-spy",
        kind=WorkloadKind.endpoint,
        spec={
            "command": [python.path, "-c", SPY],
            "readiness": "tcp",
            "env": {"TRY": os.pathsep.join(str(p) for p in tries)},
        },
    )


def owner_and_mode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


@pytest.mark.slow
async def test_workloads_cannot_read_the_data_dir_nor_each_other_and_keep_their_uids(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
    open_parent: Path,
) -> None:
    data = private_data_dir(open_parent)
    agent = await start_agent(machine_id="m-iso", data_dir=data, python=workload_python.path)
    assert isinstance(agent.driver, ProcessDriver)
    driver = agent.driver
    token = secrets.token_urlsafe(24)
    notebook = control.workload("w-nb", access_token=token)  # a real Jupyter server
    await control.put_desired("m-iso", 1, [notebook])
    nb = await control.wait_workload("m-iso", "w-nb", lambda w: w.phase is running, within_s=90)
    nb_pid = processes.track(nb.pid)
    nb_dir = driver.private_dir(data / "workloads" / "w-nb")
    nb_uid = psutil.Process(nb_pid).uids().real
    assert nb_dir == driver.uids.homes / str(nb_uid)

    tries = [
        data / "einsora.db",
        data,
        data / "workloads" / "w-nb" / "token",  # the agent's copy, for its probe
        data / "agent" / "m-iso" / "workloads" / "w-nb.json",
        nb_dir / "jupyter" / "token",
        nb_dir / "home",
        nb_dir,
        driver.uids.homes,
    ]
    the_spy = spy(control, workload_python, tries)
    await control.put_desired("m-iso", 2, [notebook, the_spy])
    seen = await control.wait_workload("m-iso", "w-spy", lambda w: w.phase is running)
    spy_pid = processes.track(seen.pid)
    spy_dir = driver.private_dir(data / "workloads" / "w-spy")
    report = json.loads((spy_dir / "home" / "report.json").read_text())

    assert report["tries"] == {str(p): "PermissionError" for p in tries}
    spy_uid = report["uid"]
    assert spy_uid != nb_uid
    for uid in (spy_uid, nb_uid):
        assert isolation.FIRST_UID <= uid < isolation.FIRST_UID + isolation.UID_COUNT
    assert report["gid"] == spy_uid
    assert report["groups"] == []
    assert report["home"] == report["cwd"] == str(spy_dir / "home")
    assert report["user"] == "w-spy"
    assert owner_and_mode(spy_dir) == (spy_uid, 0o700)
    assert owner_and_mode(spy_dir / "home" / "mine.txt") == (spy_uid, 0o600)
    assert owner_and_mode(nb_dir / "jupyter" / "token") == (nb_uid, 0o600)
    assert (nb_dir / "jupyter" / "token").read_text() == token
    assert owner_and_mode(data / "workloads" / "w-nb") == (0, 0o700)

    # The agent restarts: it adopts both, and each keeps its uid (and its private directory).
    await agent.stop()
    agent = await start_agent(machine_id="m-iso", data_dir=data, python=workload_python.path)
    assert isinstance(agent.driver, ProcessDriver)
    await control.put_desired("m-iso", 3, [notebook, the_spy])
    state = await control.wait_observed(
        "m-iso",
        lambda s: (
            s.generation_applied == 3
            and {w.workload_id: w.phase for w in s.workloads} == {"w-nb": running, "w-spy": running}
        ),
    )
    assert {w.workload_id: w.pid for w in state.workloads} == {"w-nb": nb_pid, "w-spy": spy_pid}
    assert psutil.Process(nb_pid).uids().real == nb_uid
    assert psutil.Process(spy_pid).uids().real == spy_uid
    assert agent.driver.private_dir(data / "workloads" / "w-nb") == nb_dir

    # Parked, nothing of it is left running; resumed, it runs as the same uid again, its files
    # where they were.
    daemon = processes.track(int((spy_dir / "home" / "daemon.pid").read_text()))
    assert psutil.Process(daemon).uids().real == spy_uid
    parked = the_spy.model_copy(update={"target": Target.parked})
    await control.put_desired("m-iso", 4, [notebook, parked])
    await control.wait_workload("m-iso", "w-spy", lambda w: w.phase is ObservedPhase.parked)
    assert not processes.alive(daemon)
    await control.put_desired("m-iso", 5, [notebook, the_spy])
    again = await control.wait_workload(
        "m-iso", "w-spy", lambda w: w.phase is running and w.pid != spy_pid
    )
    assert psutil.Process(processes.track(again.pid)).uids().real == spy_uid
    assert (spy_dir / "home" / "mine.txt").exists()

    # Removed: their private directories go with them.
    removed = [w.model_copy(update={"target": Target.removed}) for w in (notebook, the_spy)]
    await control.put_desired("m-iso", 6, removed)
    await control.wait_observed(
        "m-iso",
        lambda s: (
            len(s.workloads) == 2 and all(w.phase is ObservedPhase.removed for w in s.workloads)
        ),
        within_s=60,
    )
    assert not nb_dir.exists()
    assert not spy_dir.exists()


async def test_a_program_or_a_data_dir_the_workload_must_not_reach_is_refused_with_its_path(
    control: ControlPlane,
    start_agent: StartAgent,
    workload_python: WorkloadPython,
    open_parent: Path,
) -> None:
    data = private_data_dir(open_parent)
    hidden = open_parent / "hidden"
    hidden.mkdir(mode=0o700)  # like /root: the program inside cannot be run by others
    (hidden / "python3").symlink_to(workload_python.path)
    await start_agent(machine_id="m-iso2", data_dir=data)
    command = [str(hidden / "python3"), "-m", "http.server", "$PORT"]
    hid = control.workload("w-hid", kind=WorkloadKind.endpoint, spec={"command": command})
    await control.put_desired("m-iso2", 1, [hid])
    seen = await control.wait_workload("m-iso2", "w-hid", lambda w: w.phase is ObservedPhase.failed)
    assert f"its program {hidden / 'python3'} cannot be run" in seen.reason
    assert f"{hidden} (drwx------, owner uid 0) is closed to other users" in seen.reason
    assert seen.pid is None

    data.chmod(0o755)  # the data dir open: no workload starts, whatever it runs
    web = control.workload(
        "w-web", kind=WorkloadKind.endpoint, spec={"command": workload_python.http_server()}
    )
    await control.put_desired("m-iso2", 2, [hid, web])
    seen = await control.wait_workload("m-iso2", "w-web", lambda w: w.phase is ObservedPhase.failed)
    assert f"the agent's data dir {data} (drwxr-xr-x, owner uid 0) is open" in seen.reason
    assert f"chmod 700 {data}" in seen.reason
    assert seen.pid is None
