"""One service of the cell as a process of its own, for a fault to SIGKILL, SIGSTOP or SIGCONT,
and to start again with the same command, data dir and log; and waiting on what such processes
do, which has no event to wait on here.

Every process dies with the harness (Linux's parent-death signal), so a harness killed in the
middle of a run leaves nothing behind; and `end()` thaws a frozen one before it asks it to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

EINSORA = str(Path(sys.executable).parent / "einsora")
"""The command every service of the cell runs as."""


def _die_with_harness() -> None:
    """In the child, before exec: SIGKILL it when the process that started it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Proc:
    """`argv` run with `env`, its output appended to `log`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log
        self.frozen = False
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """Its exit status once it exited (by itself or by a signal); None while it runs."""
        return None if self._process is None else self._process.poll()

    def start(self) -> None:
        if self.alive:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=_die_with_harness,
            )
        self.frozen = False
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL, as a crash would; waits until it is gone."""
        if self._process is None or self._process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self.frozen = False

    def freeze(self) -> None:
        """SIGSTOP: it holds its connections and sockets, and does nothing."""
        if self.alive and self._process is not None:
            os.kill(self._process.pid, signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        """SIGCONT."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGCONT)
        self.frozen = False

    def end(self, timeout_s: float = 20.0) -> None:
        """Stop it for good: SIGTERM (thawed first), then SIGKILL after `timeout_s`."""
        if self._process is None or self._process.poll() is not None:
            return
        self.thaw()
        self._process.terminate()
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 20) -> str:
        """The end of its log, for a failure's message."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def until(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    """Poll `await check()` gently until it is true: the state lives in other processes."""
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:g} s: {what}")
        await asyncio.sleep(0.2)
