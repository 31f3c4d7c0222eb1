"""When a repair runs: the one loop behind every projection and every anti-entropy pass.

A repair makes what the bus holds agree with what the store says. An example is a bucket that
projects a table (ADR-0011). It runs:

- at start;
- once per period;
- at once after a reconnect to NATS (the `reconnects` signal);
- soon after someone asks (`wanted()`: a route could not reach the bus);
- at a time the repair itself names (`due`, say the next key to expire);
- soon after a pass failed (`RETRY_S`).

A pass that fails in a way that trying again can cure logs one line per outage, and the return
logs one more. A pass that fails for any other reason logs its traceback and runs again after a
period: a bug must not end the repairs for good, since the next pass may get past it. The loop
ends only when it is stopped.

Before this module, the api had four copies of this loop, with three different rules for a
failure, each polling the reconnect counter every second (issue 37).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS

from einsora.common.bus.reconnects import reconnects
from einsora.common.failures import log_failure, outlives

log = logging.getLogger("einsora.repair")

RETRY_S = 5.0
"""How soon a pass that failed, or that someone asked for, runs at most."""

STOP_WITHIN_S = 10.0
"""How long `stop()` waits for a pass in progress before cancelling it."""


class RepairLoop:
    """Runs `repair` as the module says, until stopped.

    `failures` names refusals to outlive besides transient failures (a refused permission, a
    store error): logged without a traceback. `due` gives the seconds until the repair wants to
    run again of its own accord (None: at the period). `passes` counts completed passes.
    """

    def __init__(
        self,
        nc: NATS,
        repair: Callable[[], Awaitable[object]],
        *,
        what: str,
        period_s: float,
        failures: tuple[type[BaseException], ...] = (),
        due: Callable[[], float | None] | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be positive")
        self._nc = nc
        self._repair = repair
        self._what = what
        self._period_s = period_s
        self._failures = failures
        self._due = due
        self._retry_s = retry_s
        self._wanted = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.passes = 0

    async def start(self, *, first_now: bool = False) -> None:
        """Start the loop; with `first_now`, run the first pass before returning (its failure
        is logged and retried like any other)."""
        self._stopping.clear()
        first_done = False
        if first_now:
            await self._pass()
            first_done = True
        self._task = asyncio.create_task(self._run(first_done), name=self._what)

    async def stop(self) -> None:
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_WITHIN_S)
        except TimeoutError:
            log.warning(f"the {self._what} did not stop in time; cancelled")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def wanted(self) -> None:
        """Ask for a pass soon."""
        self._wanted.set()

    async def _run(self, first_done: bool) -> None:
        signal = reconnects(self._nc)
        seen = signal.count
        due = self._next_due() if first_done else 0.0
        while not self._stopping.is_set():
            wait = due - time.monotonic()
            if wait > 0 and not self._wanted.is_set() and signal.count == seen:
                await self._until(wait, signal.wait_beyond(seen))
                continue
            if self._wanted.is_set():
                self._wanted.clear()
                if self._failing and signal.count == seen and time.monotonic() < due:
                    continue  # while failing, the retry is due within `retry_s` already
            seen = signal.count
            await self._pass()
            due = self._next_due()

    async def _until(self, wait_s: float, reconnected: Awaitable[int]) -> None:
        """Until `wait_s` passes, a pass is asked for, the client reconnects, or a stop."""
        waits = [
            asyncio.ensure_future(self._wanted.wait()),
            asyncio.ensure_future(self._stopping.wait()),
            asyncio.ensure_future(reconnected),
        ]
        try:
            await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _pass(self) -> None:
        try:
            await self._repair()
        except Exception as exc:
            if outlives(exc, *self._failures):
                if not self._failing:
                    log_failure(log, f"{self._what} pass failed; will retry", exc)
                self._failing = True
            else:
                # A bug must not end the repairs for good: the next pass may get past it.
                log.exception(f"{self._what} pass failed unexpectedly")
                self._failing = False
            return
        if self._failing:
            log.info(f"{self._what} passes again")
        self._failing = False
        self.passes += 1

    def _next_due(self) -> float:
        now = time.monotonic()
        if self._failing:
            return now + min(self._period_s, self._retry_s)
        due = now + self._period_s
        if self._due is not None and (soon := self._due()) is not None:
            due = min(due, now + max(soon, 0.0))
        return due
