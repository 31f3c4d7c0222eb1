"""The shape every service has, so a command runs one alone and Solo runs them all.

A service is built from `Settings` (and its own options), `start()` returns once it serves,
and `stop()` stops it cleanly and may be called twice. Solo starts them in order and stops
them in reverse; they still talk to each other only over NATS.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Protocol

from einsora.common import runloop


class Service(Protocol):
    """A part of Einsora that Solo or its own command can run."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve_until_signalled(
    service: Service, on_started: Callable[[], None] | None = None
) -> int:
    """What every `einsora <service>` command does: start, say so, wait for SIGINT or SIGTERM,
    stop. Returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    runloop.settle()
    try:
        if on_started is not None:
            on_started()
        await stop.wait()
    finally:
        await service.stop()
    return 0
