"""The route table: where each running workload answers, from the `routes` bucket.

The scheduler writes a workload's route when it is running and deletes it when it stops. The
proxy keeps a copy in memory from a watch on the whole bucket; a deleted route ends that site's
sessions and closes its WebSockets at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import ValidationError

from einsora.common.bus import names
from einsora.common.schemas import Route

log = logging.getLogger("einsora.proxy.routes")


class RouteTable:
    """Routes by workload id, kept current by a KV watch."""

    def __init__(self, on_removed: Callable[[str], object]):
        self._routes: dict[str, Route] = {}
        self._on_removed = on_removed
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    def get(self, workload_id: str) -> Route | None:
        return self._routes.get(workload_id)

    async def start(self, js: JetStreamContext) -> None:
        kv = await js.key_value(names.ROUTES.name)
        self._task = asyncio.create_task(self._watch(kv), name="proxy routes watch")
        await asyncio.wait_for(self._ready.wait(), 10)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, kv: KeyValue) -> None:
        watcher = await kv.watchall()
        try:
            async for entry in watcher:
                if entry is None:  # the initial values are all in
                    self._ready.set()
                    continue
                self._apply(entry.key, entry.operation, entry.value)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    def _apply(self, key: str, operation: str | None, value: bytes | None) -> None:
        if operation in ("DEL", "PURGE") or not value:
            if self._routes.pop(key, None) is not None:
                log.info("route removed", extra={"workload": key})
            self._on_removed(key)
            return
        try:
            route = Route.from_bytes(value)
        except ValidationError:
            log.warning("unreadable route ignored", extra={"workload": key})
            return
        self._routes[key] = route
