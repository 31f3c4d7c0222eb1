"""Writing observed states: at once when something changed, and as a heartbeat for every machine.

One task serves every machine the process hosts (a thousand sim machines cost one task, not a
thousand timers). Changes made while a batch is being written go into the next batch, so a burst
of changes on one machine is one write. A write that fails (NATS away) is retried on the next
pass; nothing is lost, because each write is the machine's complete state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

import nats.errors

from einsora.common.failures import log_failure, outlived, outlives
from einsora.common.runloop import raise_if_cancelled

log = logging.getLogger("einsora.agent")

M = TypeVar("M")

RETRY_S = 0.5
CONCURRENCY = 256
SLICES = 100
"""Heartbeats go out in this many slices spread over the interval: a thousand machines writing
at the same instant would arrive at the scheduler as one burst and delay its admissions. The
`machines` bucket is one stream, fsynced message by message, so a desired state written just
after a slice waits behind every heartbeat in it: with 10 slices (100 machines a second) that
was the 25-39 ms tail of bench/admission.py's paced launches, with 100 slices it is 12-16 ms."""


class ObservedPublisher(Generic[M]):
    """Writes each machine's observed state when marked, and all of them every `heartbeat_s`."""

    def __init__(
        self,
        machines: Callable[[], Iterable[M]],
        write: Callable[[M], Awaitable[None]],
        heartbeat_s: float,
    ) -> None:
        self._machines = machines
        self._write = write
        self.heartbeat_s = heartbeat_s
        self._dirty: dict[int, M] = {}
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.writes = 0

    def mark(self, machine: M) -> None:
        """Write this machine's observed state soon (coalesced with other changes)."""
        self._dirty[id(machine)] = machine
        self._event.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="observed publisher")

    async def stop(self) -> None:
        """Write what is still marked (best effort), then stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._dirty:
            with outlived(nats.errors.Error):
                await asyncio.wait_for(self._flush(list(self._dirty.values())), 2.0)

    async def _run(self) -> None:
        tick_s = self.heartbeat_s / SLICES
        next_beat = time.monotonic() + tick_s
        slice_no = 0
        while True:
            raise_if_cancelled()
            timeout = next_beat - time.monotonic()
            if timeout > 0 and not self._event.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), timeout)
            self._event.clear()
            batch = list(self._dirty.values())
            if time.monotonic() >= next_beat:
                # Every machine beats once per interval: slice k holds machines k, k+10, ...
                beating = list(self._machines())[slice_no::SLICES]
                marked = {id(m) for m in batch}
                batch.extend(m for m in beating if id(m) not in marked)
                slice_no = (slice_no + 1) % SLICES
                next_beat = time.monotonic() + tick_s
            self._dirty.clear()
            failed = await self._flush(batch)
            if failed:
                for machine in failed:
                    self._dirty.setdefault(id(machine), machine)
                await asyncio.sleep(RETRY_S)
                self._event.set()

    async def _flush(self, batch: list[M]) -> list[M]:
        """Write every machine of `batch`; return those whose write failed."""
        failed: list[M] = []
        semaphore = asyncio.Semaphore(CONCURRENCY)

        async def one(machine: M) -> None:
            async with semaphore:
                try:
                    await self._write(machine)
                    self.writes += 1
                except Exception as exc:
                    if not outlives(exc, nats.errors.Error):  # a refusal: retried, said in full
                        raise
                    failed.append(machine)
                    if not self._failing:
                        log_failure(log, "observed state not written; retrying", exc)
                    self._failing = True

        await asyncio.gather(*(one(m) for m in batch))
        if not failed and self._failing:
            log.info("observed state written again")
            self._failing = False
        return failed
