"""Starting, identifying, reaping and signalling workload processes.

A workload process runs in its own session (so a killed agent, or a Ctrl-C in the agent's
terminal, leaves it running), with its output appended to log files. It is started with
`posix_spawn` through `/bin/sh` (which changes directory, then `exec`s the command, so the pid is
the workload's): no `subprocess.Popen` object is left behind to warn or to reap the process behind
our back, and no `fork` of a threaded agent. A process is identified by pid AND start time, so a
recycled pid is never signalled. A workload that runs as a user of its own is started through
`runas` instead, with the agent's Python, which drops root before it `exec`s the workload.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import psutil

from einsora.agent.drivers import runas

_TRAMPOLINE = 'cd -- "$1" || exit 126; shift; exec "$@"'
_DEFAULT_SIGNALS = tuple(
    s for s in (signal.SIGPIPE, getattr(signal, "SIGXFSZ", None), signal.SIGINT) if s is not None
)


@dataclass(frozen=True)
class Spawned:
    """A process just started: its pid and its start time as psutil reports it."""

    pid: int
    create_time: float


def spawn(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], stdout: Path, stderr: Path
) -> Spawned:
    """Start `argv` in `cwd`, in a new session, output appended to `stdout` and `stderr`.

    Raises OSError when the process cannot be created. A command that does not exist starts,
    then exits 127 with the shell's message in `stderr`.
    """
    args = ["/bin/sh", "-c", _TRAMPOLINE, "einsora-workload", str(cwd), *argv]
    return _spawn("/bin/sh", args, env, stdout, stderr)


def spawn_as(launch_file: Path, *, stdout: Path, stderr: Path) -> Spawned:
    """Start the workload `launch_file` describes as its own user (see `runas`), in a new
    session, output appended to `stdout` and `stderr`. Only a root agent can."""
    python = sys.executable
    args = [python, "-I", "-S", str(Path(runas.__file__)), str(launch_file)]
    return _spawn(python, args, {}, stdout, stderr)


def _spawn(
    path: str, args: list[str], env: Mapping[str, str], stdout: Path, stderr: Path
) -> Spawned:
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(stdout), flags, 0o600),
        (os.POSIX_SPAWN_OPEN, 2, str(stderr), flags, 0o600),
    ]
    try:
        pid = os.posix_spawn(
            path,
            args,
            dict(env),
            file_actions=actions,
            setsid=True,
            setsigdef=_DEFAULT_SIGNALS,
            setsigmask=(),
        )
    except NotImplementedError:  # no POSIX_SPAWN_SETSID (older macOS): a process group of its own
        pid = os.posix_spawn(
            path,
            args,
            dict(env),
            file_actions=actions,
            setpgroup=0,
            setsigdef=_DEFAULT_SIGNALS,
            setsigmask=(),
        )
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        created = time.time()  # already gone: the next observation reaps it and says why
    return Spawned(pid, created)


def same_process(pid: int, create_time: float) -> psutil.Process | None:
    """The live process `pid` if it is the one started at `create_time` (not a recycled pid)."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.05:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return proc


RUNNING: Final = "running"


def reap(pid: int) -> int | Literal["running"] | None:
    """For a child of this agent: RUNNING, or its exit code once it ended (negative: killed by
    that signal). None when it is not our child (or was reaped already)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done == 0:
        return RUNNING
    return os.waitstatus_to_exitcode(status)


def describe_exit(code: int | None) -> str:
    """`exited with code 1`, `killed by signal 9 (SIGKILL)`, or that the code is unknown."""
    if code is None:
        return "its process ended (exit code unknown: it was not started by this agent run)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exited with code {code}"


LOG_MARKER: Final = "== einsora: started at "
"""The line the driver writes in a workload's logs before each start."""


def log_tail(path: Path, lines: int = 5, limit: int = 600) -> str:
    """The last non-empty lines of a log file written since the last start, on one line, at
    most `limit` characters."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    marker = text.rfind(LOG_MARKER)
    if marker >= 0:
        text = text[marker:].partition("\n")[2]
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    tail = " | ".join(kept)
    return tail if len(tail) <= limit else "…" + tail[-limit:]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class _Exit:
    """Watches one process end; for our own child, keeps the exit code it reaped."""

    def __init__(self, pid: int, create_time: float, child: bool) -> None:
        self.pid, self.create_time, self.child = pid, create_time, child
        self.code: int | None = None

    def alive(self) -> bool:
        if self.child:
            state = reap(self.pid)
            if state == RUNNING:
                return True
            self.code = state if isinstance(state, int) else self.code
            return False
        return same_process(self.pid, self.create_time) is not None


async def _ended_within(exit_: _Exit, seconds: float, poll_s: float) -> bool:
    """Whether the process ends within `seconds`. Polled: a process's end sends no event that
    works for children and adopted processes alike."""
    deadline = time.monotonic() + seconds
    while exit_.alive():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


async def terminate(
    pid: int, create_time: float, *, child: bool, grace_s: float, poll_s: float = 0.05
) -> int | None:
    """SIGTERM to the process group, SIGKILL after `grace_s`; then any descendants left.

    Returns the exit code when the process was our child, else None. Signals nothing when `pid`
    is no longer the process started at `create_time`.
    """
    exit_ = _Exit(pid, create_time, child)
    proc = same_process(pid, create_time)
    if proc is None:
        exit_.alive()  # reaps a zombie child, keeping its code
        return exit_.code
    try:
        descendants = proc.children(recursive=True)
    except psutil.Error:
        descendants = []
    _signal_group(pid, signal.SIGTERM)
    if not await _ended_within(exit_, grace_s, poll_s):
        _signal_group(pid, signal.SIGKILL)
        await _ended_within(exit_, 5.0, poll_s)
    for d in descendants:  # e.g. Jupyter kernels, which live in sessions of their own
        with contextlib.suppress(psutil.Error):
            if d.is_running():
                d.kill()
    return exit_.code
