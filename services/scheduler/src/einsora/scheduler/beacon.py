"""The region's beacon: this scheduler's heartbeat and free capacity, every few seconds
(`regions/<region>`, ADR-0022).

The api lists it in `GET /v1/regions` and tells a launch that waits for a scheduler that is
down; other regions' schedulers take a region step only to a region whose scheduler is up. It
reads the book between the engine's cycles (the engine changes the book only inside a cycle,
with no await, so a synchronous read sees one consistent state). A clean stop says `stopped`; a
scheduler killed goes silent, and readers judge silence by the heartbeat's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import nats.errors
from nats.js import JetStreamContext

from einsora.common.bus import bind_bucket, names
from einsora.common.failures import log_failure, outlived, outlives
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import RegionStatus, SchedulerState
from einsora.scheduler import regions
from einsora.scheduler.book import Book

log = logging.getLogger("einsora.scheduler.beacon")

PERIOD_S = 5.0


class RegionBeacon:
    """Puts this region's `RegionStatus` every `period_s` seconds while it runs."""

    def __init__(
        self, js: JetStreamContext, book: Callable[[], Book], *, period_s: float = PERIOD_S
    ) -> None:
        self._kv = bind_bucket(js, names.REGIONS)
        self._book = book
        self._period_s = period_s
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="region beacon")

    async def stop(self, *, say_stopped: bool = True) -> None:
        """Stop beating, and say this scheduler stopped (best effort: a bus that is away
        leaves readers to judge the silence). A leader deposed by a standby says nothing: the
        region's status is the new leader's to write (ADR-0021)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if not say_stopped:
            return
        status = regions.summary(self._book(), self._period_s)
        with outlived(nats.errors.Error):
            await asyncio.wait_for(
                self._put(status.model_copy(update={"state": SchedulerState.stopped})), 2.0
            )

    async def beat(self) -> None:
        """Put the region's status now."""
        await self._put(regions.summary(self._book(), self._period_s))

    async def _put(self, status: RegionStatus) -> None:
        await self._kv.put(names.region_key(status.region), status.to_bytes())

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.beat()
                if self._failing:
                    log.info("region beacon writing again")
                self._failing = False
            except Exception as exc:
                raise_if_cancelled()
                if not outlives(exc, nats.errors.Error):  # a refusal: retried, with its traceback
                    raise
                if not self._failing:
                    log_failure(log, "region beacon cannot write; retrying", exc)
                self._failing = True
            await asyncio.sleep(self._period_s)
