"""The `enrolments` bucket holds every enrolled machine's record from the store.

The routes write it as they go: a machine that joins is put before its credential is returned,
a revocation before the DELETE answers. A crash between the commit and the bus, or a bus that
came back empty, leaves it behind the store, so a pass runs at start, on a period and after
every reconnect: each record the bucket lacks, or holds otherwise, is put again. A revocation
is final: a pass never puts a record that is not revoked over one that is (a pass that read the
store just before a revocation committed cannot undo it), and a key the store does not know is
deleted (only the api writes the bucket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KV_DEL, KV_PURGE
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from einsora.api.services.machines import enrolments
from einsora.api.store import Store
from einsora.common.bus import bind_bucket, names
from einsora.common.errors import BusUnavailable
from einsora.common.schemas import Enrolment

log = logging.getLogger("einsora.api.enrolments")

SYNC_PERIOD_S = 60.0
RECONNECT_POLL_S = 1.0
READ_TIMEOUT_S = 10.0
_FAILURES = (BusUnavailable, nats.errors.Error, OSError, TimeoutError, SQLAlchemyError)


class EnrolmentsSync:
    """Puts enrolments into KV for the routes, and repairs the bucket (see the module)."""

    def __init__(
        self, store: Store, nc: NATS, js: JetStreamContext, *, period_s: float = SYNC_PERIOD_S
    ) -> None:
        self._store = store
        self._nc = nc
        self._kv = bind_bucket(js, names.ENROLMENTS)
        self._period_s = period_s
        self._task: asyncio.Task[None] | None = None
        self._wanted = asyncio.Event()
        self.passes = 0

    async def start(self) -> None:
        """A first pass now, then as the module says (in the background)."""
        await self._pass_logged()
        self._task = asyncio.create_task(self._run(), name="enrolments sync")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def put(self, enrolment: Enrolment) -> None:
        """Write one record now; a failure is left to the next pass (asked for at once)."""
        try:
            await self._kv.put(names.enrolment_key(enrolment.machine_id), enrolment.to_bytes())
        except _FAILURES as exc:
            log.warning(
                "an enrolment did not reach the bus; the sync will put it",
                extra={"machine_id": enrolment.machine_id, "error": repr(exc)},
            )
            self._wanted.set()

    async def _run(self) -> None:
        reconnects = self._nc.stats["reconnects"]
        waited = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), RECONNECT_POLL_S)
            waited += RECONNECT_POLL_S
            now_reconnects = self._nc.stats["reconnects"]
            if self._wanted.is_set() or now_reconnects != reconnects or waited >= self._period_s:
                self._wanted.clear()
                reconnects, waited = now_reconnects, 0.0
                if not await self._pass_logged():
                    self._wanted.set()
                    await asyncio.sleep(5.0)

    async def _pass_logged(self) -> bool:
        try:
            await self.repair()
        except _FAILURES as exc:
            log.warning("enrolments sync pass failed; retrying", extra={"error": repr(exc)})
            return False
        return True

    async def repair(self) -> tuple[list[str], list[str]]:
        """One pass: (machine ids put, bucket keys deleted)."""
        in_kv = await self._read_bucket()
        stored = await enrolments(self._store)
        put: list[str] = []
        for machine_id, enrolment in stored.items():
            have = in_kv.pop(machine_id, None)
            if have == enrolment:
                continue
            if have is not None and have.revoked and not enrolment.revoked:
                continue  # a revocation that committed after the store was read: it stands
            await self._kv.put(names.enrolment_key(machine_id), enrolment.to_bytes())
            put.append(machine_id)
        deleted = sorted(in_kv)
        for key in deleted:
            await self._kv.delete(key)
        self.passes += 1
        if put or deleted:
            log.info(
                "enrolments bucket repaired from the store",
                extra={"put": len(put), "deleted": len(deleted)},
            )
        return put, deleted

    async def _read_bucket(self) -> dict[str, Enrolment | None]:
        """Every live key of the bucket: its record, or None where it is unreadable."""
        found: dict[str, Enrolment | None] = {}
        watcher = await self._kv.watch(">")
        try:
            while True:
                entry = await watcher.updates(timeout=READ_TIMEOUT_S)  # type: ignore[no-untyped-call]
                if entry is None:  # nats-py's "initial values done" marker
                    break
                if entry.operation in (KV_DEL, KV_PURGE) or entry.value is None:
                    found.pop(entry.key, None)
                    continue
                try:
                    found[entry.key] = Enrolment.from_bytes(entry.value)
                except ValidationError:
                    found[entry.key] = None
        finally:
            with contextlib.suppress(*_FAILURES):
                await watcher.stop()  # type: ignore[no-untyped-call]
        return found
