"""Running a command's event loop: uvloop where installed, and a garbage collector tuned for a
service that allocates many short-lived objects per message.

The proxy, the api and Solo depend on uvloop (it roughly halves the per-request loop overhead);
the agent does not need it, so `einsora.common` does not depend on it and falls back to the
standard loop.

CPython's default thresholds (700, 10, 10) run a young collection every 700 allocations and a
full one every 100 young ones; under a burst of launches the full collections, walking every
object the service holds, took 90-190 ms each and set the tail latency. `run` raises the young
threshold, and `settle()` (after start-up) moves everything start-up made into the permanent
generation (`gc.freeze`), so later collections walk only what serving allocates.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

GC_THRESHOLDS = (50_000, 20, 100)
"""(young, middle, old), chosen with bench/admission.py: against the defaults (700, 10, 10) in
one sitting, 1,035-1,067 admissions/s against 978 (the paced latency was the same within
noise); the old generation still runs, so cycles are still freed."""


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on uvloop when it is installed, with the tuned collector."""
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def settle() -> None:
    """Once start-up is done: collect, then freeze what survived (modules, settings, caches
    filled at start), so no later collection walks it again."""
    gc.collect()
    gc.freeze()


def raise_if_cancelled() -> None:
    """Raise CancelledError when this task was asked to stop and the request was swallowed.

    nats-py turns a cancelled request or publish into its own TimeoutError, and Python 3.11's
    `wait_for` drops a cancel that races its result; the task is then left `cancelling()` with
    nothing pending, and a loop that catches the timeout and goes on would run for ever under its
    service's `stop()` (a scheduler's teardown hung so, renewing its lease). Every turn of a
    background loop that talks to the bus calls this first."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
