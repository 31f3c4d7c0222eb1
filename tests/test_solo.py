"""`einsora solo` and the `einsora` CLI, as a user runs them: subprocesses on free ports.

What a new user meets first: the owner token printed once (to a terminal only: piped output
names the token file instead) and saved with mode 0600, a notebook
launched with `--wait` reaching running, a stop and start that keeps every workload (process
workloads with the same pid), a clear message for a taken port, a quick clean exit on SIGTERM,
and the CLI's exit codes and JSON output.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

EINSORA = str(Path(sys.executable).parent / "einsora")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Solo:
    data_dir: Path
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    output: str = ""
    terminal: int | None = None
    """The pty's controlling side, while Solo's stdout is a terminal."""

    def start(self, *, on_a_terminal: bool = False) -> str:
        """Start Solo, its stdout piped (or a terminal); returns what it printed up to its
        greeting."""
        if on_a_terminal:
            return self._start_on_a_terminal()
        self.proc = subprocess.Popen(
            [EINSORA, "solo"],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C") or time.monotonic() > deadline:
                break
        self.output = "".join(lines)
        assert "Einsora Solo is running" in self.output, self.output
        return self.output

    def _start_on_a_terminal(self) -> str:
        self.terminal, side = pty.openpty()
        self.proc = subprocess.Popen(
            [EINSORA, "solo"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=side,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        os.close(side)
        seen = b""
        deadline = time.monotonic() + 60
        while b"Press Ctrl-C" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([self.terminal], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                chunk = os.read(self.terminal, 4096)
            except OSError:  # EIO: Solo exited and closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        self.output = seen.decode().replace("\r\n", "\n")  # a terminal ends lines with CR LF
        assert "Einsora Solo is running" in self.output, self.output
        return self.output

    def _close_terminal(self) -> None:
        if self.terminal is not None:
            os.close(self.terminal)
            self.terminal = None

    def stop(self) -> float:
        """SIGTERM; returns how long Solo took to exit."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        took = time.monotonic() - t0
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._close_terminal()
        return took

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EINSORA, *args], env=self.env, capture_output=True, text=True, timeout=120, check=False
        )


@pytest.fixture
def solo(tmp_path: Path) -> Iterator[Solo]:
    env = dict(os.environ)
    for key in ("EINSORA_TOKEN", "EINSORA_API", "EINSORA_NATS_URL"):
        env.pop(key, None)
    env.update(
        {
            "EINSORA_DATA_DIR": str(tmp_path / "data"),
            "EINSORA_API_PORT": str(_free_port()),
            "EINSORA_PROXY_PORT": str(_free_port()),
            "EINSORA_GATEWAY_PORT": str(_free_port()),
            "EINSORA_NATS_PORT": str(_free_port()),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
        }
    )
    running = Solo(tmp_path / "data", env)
    yield running
    if running.proc is not None:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait()
        if running.proc.stdout is not None:
            running.proc.stdout.close()
    running._close_terminal()
    # Workloads outlive Solo by design; the test's own must not outlive the test.
    uids = _workload_uids(tmp_path / "data")
    for proc in psutil.process_iter(["cwd", "uids"]):
        try:
            mine = proc.info["cwd"] and proc.info["cwd"].startswith(str(tmp_path))
            if mine or proc.info["uids"].real in uids:
                proc.kill()
        except psutil.Error:
            pass


def _workload_uids(data_dir: Path) -> set[int]:
    """The users a root agent ran this data dir's workloads as (ADR-0007)."""
    return {
        int(path.read_text().strip())
        for path in (data_dir / "workloads").glob("*/uid")
        if path.read_text().strip().isdigit()
    }


def _notebook_pid(data_dir: Path, workload_id: str) -> int:
    root = str(data_dir / "workloads" / workload_id)
    uid_file = data_dir / "workloads" / workload_id / "uid"
    # A root agent runs it as a user of its own, in a private dir elsewhere (ADR-0007).
    uid = int(uid_file.read_text()) if uid_file.exists() else None
    for proc in psutil.process_iter(["cwd", "cmdline", "uids"]):
        try:
            cwd = proc.info["cwd"] or ""
            ours = proc.info["uids"].real == uid if uid is not None else cwd.startswith(root)
            if ours and "jupyter" in " ".join(proc.info["cmdline"] or []):
                return int(proc.pid)
        except psutil.Error:
            continue
    raise AssertionError(f"no Jupyter process runs for {workload_id}")


def test_first_start_on_a_terminal_prints_and_saves_the_owner_token(solo: Solo) -> None:
    out = solo.start(on_a_terminal=True)
    match = re.search(r"^\s+(tsk_\S+)$", out, re.MULTILINE)
    assert match, out
    token_file = solo.data_dir / "owner.token"
    assert str(token_file) in out
    assert token_file.read_text().strip() == match.group(1)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert "einsora launch" in out
    assert solo.stop() < 10

    again = solo.start(on_a_terminal=True)
    assert "tsk_" not in again  # shown once
    assert str(token_file) in again
    solo.stop()


def test_the_first_start_prints_a_one_time_dashboard_link_or_how_to_build_it(
    solo: Solo, tmp_path: Path
) -> None:
    built = tmp_path / "dist"
    built.mkdir()
    (built / "index.html").write_text("<!doctype html><title>Einsora</title>")
    solo.env["EINSORA_DASHBOARD_DIR"] = str(built)
    out = solo.start(on_a_terminal=True)
    link = re.search(r"^\s+(http://127\.0\.0\.1:\d+/sign-in#link=sil_\S+)$", out, re.MULTILINE)
    assert link, out
    assert solo.stop() < 10

    solo.env["EINSORA_DASHBOARD_DIR"] = str(tmp_path / "not-built")
    again = solo.start(on_a_terminal=True)
    assert "sil_" not in again  # one link, on the first start only
    assert "make dashboard" in again
    assert "Node.js 20" in again
    solo.stop()


def test_a_greeting_that_is_not_a_terminal_names_the_token_file_not_the_token(
    solo: Solo,
) -> None:
    out = solo.start()  # stdout is a pipe, as a log file or a journal would be
    token_file = solo.data_dir / "owner.token"
    token = token_file.read_text().strip()
    assert token.startswith("tsk_")
    assert token not in out
    assert "tsk_" not in out
    assert str(token_file) in out
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    solo.stop()


def test_launch_wait_then_stop_and_start_keeps_everything(solo: Solo) -> None:
    solo.start()
    launched = solo.cli("launch", "notebook", "--class", "cpu-1c-2g", "--wait", "--json")
    assert launched.returncode == 0, launched.stderr
    workload = json.loads(launched.stdout)
    assert workload["state"] == "running"
    pid = _notebook_pid(solo.data_dir, workload["id"])

    assert solo.stop() < 10
    assert psutil.pid_exists(pid)  # workloads keep running while Solo is stopped
    solo.start()
    shown = solo.cli("show", workload["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "running"
    assert _notebook_pid(solo.data_dir, workload["id"]) == pid  # re-adopted, not restarted
    listed = solo.cli("ls", "--json")
    assert [w["id"] for w in json.loads(listed.stdout)] == [workload["id"]]

    removed = solo.cli("rm", workload["id"])
    assert removed.returncode == 0, removed.stderr
    solo.stop()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_notebooks_see_their_own_gpu_or_none_and_keep_them_across_a_restart(solo: Solo) -> None:
    # A machine of three H200s (one in MIG mode), read from an NVML snapshot (issue 33).
    fixture = Path(__file__).parent / "fixtures" / "nvml" / "h200x3-mig.json"
    solo.env["EINSORA_GPU_INVENTORY"] = str(fixture)
    solo.start()
    seen: dict[str, tuple[int, str]] = {}
    for class_name in ("h200-141gb", "h200-1g.18gb", "cpu-1c-2g"):
        launched = solo.cli("launch", "notebook", "--class", class_name, "--wait", "--json")
        assert launched.returncode == 0, launched.stderr
        workload_id = json.loads(launched.stdout)["id"]
        pid = _notebook_pid(solo.data_dir, workload_id)
        told = _environ(pid)["CUDA_VISIBLE_DEVICES"]
        lines = solo.cli("events", workload_id, "--json").stdout.splitlines()
        events = [json.loads(line) for line in lines]
        note = next(e["reason"] for e in events if e["state"] == "scheduled")
        if class_name == "cpu-1c-2g":
            assert told == "", note
            assert "given" not in note, note
        else:
            assert told, note
            assert f" {told}" in note, (told, note)  # "given GPU-…", "slice MIG-…"
        assert _environ(pid)["NVIDIA_VISIBLE_DEVICES"] == (told or "void")
        if os.geteuid() == 0:  # and so its device nodes are confined, in a cgroup of its own
            assert f"/einsora-workloads/{workload_id}" in Path(f"/proc/{pid}/cgroup").read_text()
        seen[workload_id] = (pid, told)
    assert len({told for _, told in seen.values()}) == 3

    solo.stop()
    solo.start()
    for workload_id, (pid, told) in seen.items():
        assert _notebook_pid(solo.data_dir, workload_id) == pid  # adopted, not restarted
        assert _environ(pid)["CUDA_VISIBLE_DEVICES"] == told
        if os.geteuid() == 0:
            assert f"/einsora-workloads/{workload_id}" in Path(f"/proc/{pid}/cgroup").read_text()
        removed = solo.cli("rm", workload_id, "--wait")
        assert removed.returncode == 0, removed.stderr
    solo.stop()


def test_launch_wait_fails_with_the_reason_and_park_resume_rm_wait(solo: Solo) -> None:
    solo.start()
    broken = json.dumps({"runtime": "command", "command": ["python3", "-c", "exit(3)"]})
    failed = solo.cli("launch", "endpoint", "--class", "cpu-1c-2g", "--spec", broken, "--wait")
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    said = failed.stderr.strip().splitlines()[-1]
    assert said.startswith("einsora: w-"), said
    assert " is failed, not running: " in said, said
    assert said.split(" is failed, not running: ")[1]  # the reason, not nothing

    launched = solo.cli("launch", "notebook", "--class", "cpu-1c-2g", "--wait")
    assert launched.returncode == 0, launched.stderr
    workload_id = launched.stdout.split()[0]
    # Each transition is printed with its reason as it happens, up to running.
    assert "running: " in launched.stderr
    # `events -f` beside: the history, then each change as it happens, each once.
    following = subprocess.Popen(
        [EINSORA, "events", "-f", workload_id, "--json"],
        env=solo.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for verb, state in (("park", "parked"), ("resume", "running"), ("rm", "removed")):
            done = solo.cli(verb, workload_id, "--wait")
            assert done.returncode == 0, (verb, done.stderr)
            assert done.stdout.strip() == f"{workload_id} is {state}"
        assert following.stdout is not None
        followed = []
        for line in following.stdout:  # until the last change arrives (or the timeout)
            followed.append(json.loads(line))
            if followed[-1]["state"] == "removed":
                break
    finally:
        following.kill()
        following.communicate(timeout=10)  # and closes its pipes
    history = [
        json.loads(line) for line in solo.cli("events", workload_id, "--json").stdout.splitlines()
    ]
    # Every entry, in order, none twice; only what the api records itself when asked (it is
    # not a change on the bus) shows in the history alone, once the follow has begun.
    assert len({json.dumps(e) for e in followed}) == len(followed)
    assert followed == [e for e in history if e in followed]
    only_stored = [e for e in history if e not in followed]
    assert all("requested by" in e["reason"] for e in only_stored), only_stored
    states = [e["state"] for e in followed]
    for state in ("parking", "parked", "running", "removing", "removed"):
        assert state in states, (state, states)
    solo.stop()


def test_a_taken_port_is_named_with_its_flag(solo: Solo) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(solo.env["EINSORA_API_PORT"])))
        s.listen()
        done = subprocess.run(
            [EINSORA, "solo"], env=solo.env, capture_output=True, text=True, timeout=60, check=False
        )
    assert done.returncode != 0
    assert solo.env["EINSORA_API_PORT"] in done.stderr
    assert "--api-port" in done.stderr


def test_cli_exit_codes_and_json(solo: Solo) -> None:
    unreachable = solo.cli("ls")
    assert unreachable.returncode == 3
    assert f"127.0.0.1:{solo.env['EINSORA_API_PORT']}" in unreachable.stderr

    solo.start()
    usage = solo.cli("launch", "notebook")
    assert usage.returncode == 2
    refused = solo.cli("show", "w-doesnotexist0000000000")
    assert refused.returncode == 1
    assert "request ID" in refused.stderr
    bad_class = solo.cli("launch", "notebook", "--class", "no-such-class")
    assert bad_class.returncode == 1
    assert "class" in bad_class.stderr
    classes = solo.cli("classes", "--json")
    assert classes.returncode == 0
    assert "cpu-1c-2g" in {c["name"] for c in json.loads(classes.stdout)}
    made = solo.cli("tokens", "create", "ci", "--json")
    assert made.returncode == 0
    token = json.loads(made.stdout)
    assert token["token"].startswith("tsk_")
    listed = solo.cli("tokens", "ls", "--json")
    assert token["id"] in {t["id"] for t in json.loads(listed.stdout)}
    assert token["token"] not in listed.stdout
    solo.stop()
