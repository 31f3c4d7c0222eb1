"""When a store-to-KV sync repairs its bucket: at start, when asked, after a reconnect to
NATS, and every period; a failed pass is tried again 5 s later.

The enrolments and the model fallbacks syncs share it (each keeps its own `repair`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS

from einsora.common.failures import log_failure, outlives
from einsora.common.runloop import raise_if_cancelled

log = logging.getLogger("einsora.api.repair")

RECONNECT_POLL_S = 1.0
"""How often the loop looks for a reconnect."""
RETRY_S = 5.0


class RepairLoop:
    """Runs `repair` as the module says; `wanted()` asks for a pass soon."""

    def __init__(
        self,
        nc: NATS,
        repair: Callable[[], Awaitable[object]],
        *,
        what: str,
        failures: tuple[type[BaseException], ...],
        period_s: float,
    ) -> None:
        self._nc = nc
        self._repair = repair
        self._what = what
        self._failures = failures
        self._period_s = period_s
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """A first pass now, then the rest in the background."""
        await self._pass_logged()
        self._task = asyncio.create_task(self._run(), name=self._what)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def wanted(self) -> None:
        self._wanted.set()

    async def _run(self) -> None:
        reconnects = self._nc.stats["reconnects"]
        waited = 0.0
        while True:
            raise_if_cancelled()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), RECONNECT_POLL_S)
            waited += RECONNECT_POLL_S
            now_reconnects = self._nc.stats["reconnects"]
            if self._wanted.is_set() or now_reconnects != reconnects or waited >= self._period_s:
                self._wanted.clear()
                reconnects, waited = now_reconnects, 0.0
                if not await self._pass_logged():
                    self._wanted.set()
                    await asyncio.sleep(RETRY_S)

    async def _pass_logged(self) -> bool:
        try:
            await self._repair()
        except Exception as exc:
            # Every transient failure, and the refusals `failures` names; a bug ends the loop.
            if not outlives(exc, *self._failures):
                raise
            log_failure(log, f"{self._what} pass failed; retrying", exc)
            return False
        return True
