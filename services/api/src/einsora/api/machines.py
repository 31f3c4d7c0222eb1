"""What the api knows of machines: each one's inventory and observed state, from KV.

The api is a trusted client of the bus, so it watches the whole `machines` bucket (inventory
and observed keys; desired values are the scheduler's and can be large) and keeps the latest of
each in memory for `/v1/machines`, `/v1/classes` and `/v1/regions`. A value that does not parse
is logged and skipped. After a reconnect the watch is started again, so a restarted server's
lost consumer never leaves the view stale for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import ValidationError

from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import Inventory, ObservedPhase, ObservedState

log = logging.getLogger("einsora.api.machines")

_KINDS = ("inventory", "observed")


@dataclass
class MachineRecord:
    """The latest inventory and observed state of one machine (either may be missing)."""

    machine_id: str
    inventory: Inventory | None = None
    observed: ObservedState | None = None

    @property
    def region(self) -> str | None:
        return self.inventory.region if self.inventory else None

    @property
    def heartbeat_at(self) -> datetime | None:
        return self.observed.heartbeat_at if self.observed else None

    @property
    def workload_count(self) -> int:
        if self.observed is None:
            return 0
        return sum(1 for w in self.observed.workloads if w.phase is not ObservedPhase.removed)


class MachinesView:
    """An in-memory view of the `machines` bucket, kept current by KV watches."""

    def __init__(self) -> None:
        self._records: dict[str, MachineRecord] = {}
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    def snapshot(self) -> list[MachineRecord]:
        """Every machine known now, by id."""
        return [self._records[k] for k in sorted(self._records)]

    async def start(self, nc: NATS, js: JetStreamContext, *, sync_timeout_s: float = 5.0) -> None:
        """Start watching; returns once the current values are loaded (or after the timeout)."""
        self._task = asyncio.create_task(self._run(nc, js), name="machines view")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._synced.wait(), sync_timeout_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def apply(self, key: str, value: bytes | None) -> None:
        """Take one KV entry (None: deleted) into the view."""
        try:
            machine_id, kind = names.split_machine_key(key)
        except ValueError:
            return
        if kind not in _KINDS:
            return
        record = self._records.setdefault(machine_id, MachineRecord(machine_id))
        try:
            if kind == "inventory":
                record.inventory = Inventory.from_bytes(value) if value else None
            else:
                record.observed = ObservedState.from_bytes(value) if value else None
        except ValidationError as exc:
            log.warning("unreadable machine value skipped", extra={"key": key, "error": str(exc)})
        if record.inventory is None and record.observed is None:
            del self._records[machine_id]

    async def _run(self, nc: NATS, js: JetStreamContext) -> None:
        kv = bind_bucket(js, names.MACHINES)
        while True:
            try:
                await self._watch_until_reconnect(nc, kv)
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                log.warning("machines watch failed; retrying", extra={"error": repr(exc)})
                await asyncio.sleep(1.0)

    async def _watch_until_reconnect(self, nc: NATS, kv: KeyValue) -> None:
        reconnects = nc.stats["reconnects"]
        watchers: list[KeyValue.KeyWatcher] = []
        pumps: list[asyncio.Task[None]] = []
        try:
            synced: list[asyncio.Event] = []
            for kind in _KINDS:
                watcher = await kv.watch(f"*.{kind}")
                watchers.append(watcher)
                synced.append(asyncio.Event())
                pumps.append(asyncio.create_task(self._pump(watcher, synced[-1])))
            await asyncio.wait_for(asyncio.gather(*(s.wait() for s in synced)), 10.0)
            self._synced.set()
            while nc.stats["reconnects"] == reconnects:
                done, _ = await asyncio.wait(
                    pumps, timeout=1.0, return_when=asyncio.FIRST_COMPLETED
                )
                if done:
                    break
        finally:
            for pump in pumps:
                pump.cancel()
            for watcher in watchers:
                with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                    await watcher.stop()  # type: ignore[no-untyped-call]

    async def _pump(self, watcher: KeyValue.KeyWatcher, synced: asyncio.Event) -> None:
        async for entry in watcher:
            if entry is None:  # nats-py's "initial values done" marker
                synced.set()
                continue
            deleted = entry.operation in ("DEL", "PURGE")
            self.apply(entry.key, None if deleted else entry.value)
