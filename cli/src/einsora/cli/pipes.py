"""What a command does when whoever reads its output goes away (`einsora ls | head -1`).

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError; left alone it ends
in a traceback, and the interpreter's last flush of stdout prints another. A command that meets
one stops at once and exits with 141 (128 + SIGPIPE), what a shell reports for a tool that
SIGPIPE ended, so `set -o pipefail` scripts see the usual code and a person sees nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

EXIT_CLOSED_PIPE = 141

P = ParamSpec("P")


def silence_closed_streams() -> None:
    """Point stdout and stderr at /dev/null where their reader has gone, so nothing written
    later (the interpreter's own last flush included) fails again."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)


def quiet_on_closed_pipe(command: Callable[P, int]) -> Callable[P, int]:
    """`command`, flushed before it returns, exiting with 141 and no output on a closed pipe."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            code = command(*args, **kwargs)
            sys.stdout.flush()  # output that fit in the buffer meets the closed pipe only here
        except BrokenPipeError:
            silence_closed_streams()
            return EXIT_CLOSED_PIPE
        return code

    return run
