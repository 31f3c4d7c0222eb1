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

import logging

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from sqlalchemy.exc import SQLAlchemyError

from einsora.api.machines import MachinesView
from einsora.api.repair_loop import RepairLoop
from einsora.api.services.machines import enrolments
from einsora.api.store import Store
from einsora.common.bus import bind_bucket, names, read_records
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import Enrolment

log = logging.getLogger("einsora.api.enrolments")

SYNC_PERIOD_S = 60.0
READ_TIMEOUT_S = 10.0


class EnrolmentsSync:
    """Puts enrolments into KV for the routes, and repairs the bucket (see the module)."""

    def __init__(
        self,
        store: Store,
        nc: NATS,
        js: JetStreamContext,
        *,
        period_s: float = SYNC_PERIOD_S,
        view: MachinesView | None = None,
    ) -> None:
        self._store = store
        self._view = view
        self._kv = bind_bucket(js, names.ENROLMENTS)
        self._loop = RepairLoop(
            nc,
            self.repair,
            what="enrolments sync",
            failures=(nats.errors.Error, SQLAlchemyError),
            period_s=period_s,
        )
        self.passes = 0

    async def start(self) -> None:
        """A first pass now, then as the module says (in the background)."""
        await self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def put(self, enrolment: Enrolment) -> None:
        """Write one record now; a failure is left to the next pass (asked for at once)."""
        value = enrolment.to_bytes()
        try:
            await self._kv.put(names.enrolment_key(enrolment.machine_id), value)
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "an enrolment did not reach the bus; the sync will put it",
                exc,
                {"machine_id": enrolment.machine_id},
            )
            self._loop.wanted()
            return
        if self._view is not None:
            # Read your writes: this api's next answer shows it, before its own watch of the
            # bucket brings the same value back (which then changes nothing).
            self._view.apply_enrolment(enrolment.machine_id, value)

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
        return await read_records(self._kv, Enrolment, timeout_s=READ_TIMEOUT_S)
