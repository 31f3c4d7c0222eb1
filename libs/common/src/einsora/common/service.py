"""The shape every service has, so a command runs one alone and Solo runs them all.

A service is built from `Settings` (and its own options), `start()` returns once it serves,
and `stop()` stops it cleanly and may be called twice. Solo starts them in order and stops
them in reverse; they still talk to each other only over NATS.

A start waits out a transient outage (NATS away, a stream without a leader: `startup.py`), so
it may take as long as the outage: a signal that comes meanwhile stops it there.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    if not await start_unless_stopped(service, stop):
        return 0
    runloop.settle()
    try:
        if on_started is not None:
            on_started()
        await stop.wait()
    finally:
        await service.stop()
    return 0


async def start_unless_stopped(service: Service, stop: asyncio.Event) -> bool:
    """Start `service`, unless `stop` is set first: then the start is cancelled, what it made
    is stopped, and False is returned. A start's own failure is raised."""
    starting = asyncio.ensure_future(service.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not starting.done():  # stopped, or this task itself cancelled
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            await service.stop()
    if starting.cancelled():
        return False
    starting.result()  # the start's own failure
    return True
