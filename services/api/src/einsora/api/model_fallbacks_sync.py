"""The `model_fallbacks` bucket holds each live endpoint's model steps, for the gateway.

An endpoint launched with `{"model": …}` steps in its fallback chain (ADR-0022) is put there
once its launch commits (before the 201), keyed by the endpoint's id; the gateway sends a
request for the endpoint's model to those models, in order, when no replica of it answers. A
crash between the commit and the bus, a bus that came back empty, or an endpoint removed since
leaves the bucket behind the store, so a pass runs at start, on a period and after every
reconnect: each record the bucket lacks or holds otherwise is put, and each key that is no live
endpoint with model steps is deleted (only the api writes the bucket).
"""

from __future__ import annotations

import json
import logging

import nats.errors
import sqlalchemy as sa
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from sqlalchemy.exc import SQLAlchemyError

from einsora.api import models as m
from einsora.api.repair_loop import RepairLoop
from einsora.api.store import Store
from einsora.common.bus import bind_bucket, names, read_records
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import ModelFallback

log = logging.getLogger("einsora.api.model_fallbacks")

SYNC_PERIOD_S = 60.0
READ_TIMEOUT_S = 10.0

_WITH_MODEL_STEPS = sa.select(
    m.workloads.c.id, m.workloads.c.tenant_id, m.workloads.c.name, m.workloads.c.fallback
).where(
    m.workloads.c.kind == "endpoint",
    m.ENDPOINT_NAME_TAKEN,
    m.workloads.c.fallback.like('%"model"%'),
)
"""Live endpoints whose chain may have a model step (the JSON is read to be sure)."""


def model_fallback(
    workload_id: str, tenant_id: str, name: str, chain: list[object]
) -> ModelFallback | None:
    """An endpoint's record, or None when its chain has no model step."""
    models = [s["model"] for s in chain if isinstance(s, dict) and isinstance(s.get("model"), str)]
    if not models:
        return None
    return ModelFallback(workload_id=workload_id, tenant_id=tenant_id, model=name, fallback=models)


class ModelFallbacksSync:
    """Puts endpoints' model steps into KV, and repairs the bucket (see the module)."""

    def __init__(
        self, store: Store, nc: NATS, js: JetStreamContext, *, period_s: float = SYNC_PERIOD_S
    ) -> None:
        self._store = store
        self._kv = bind_bucket(js, names.MODEL_FALLBACKS)
        self._loop = RepairLoop(
            nc,
            self.repair,
            what="model fallbacks sync",
            failures=(nats.errors.Error, SQLAlchemyError),
            period_s=period_s,
        )
        self.passes = 0

    async def start(self) -> None:
        """A first pass now, then as the module says (in the background)."""
        await self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def wanted(self) -> None:
        """Ask for a pass soon (an endpoint was removed, say)."""
        self._loop.wanted()

    async def put(self, record: ModelFallback) -> None:
        """Write one record now; a failure is left to the next pass (asked for at once)."""
        try:
            await self._kv.put(names.model_fallback_key(record.workload_id), record.to_bytes())
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "an endpoint's model fallbacks did not reach the bus; the sync will put them",
                exc,
                {"workload_id": record.workload_id},
            )
            self._loop.wanted()

    async def repair(self) -> tuple[list[str], list[str]]:
        """One pass: (endpoint ids put, bucket keys deleted)."""
        in_kv = await self._read_bucket()
        rows = await self._store.query(lambda conn: conn.execute(_WITH_MODEL_STEPS).all())
        put: list[str] = []
        for r in rows:
            record = model_fallback(r.id, r.tenant_id, r.name, json.loads(r.fallback))
            if record is None:
                continue
            have = in_kv.pop(r.id, None)
            if have == record:
                continue
            await self._kv.put(names.model_fallback_key(r.id), record.to_bytes())
            put.append(r.id)
        deleted = sorted(in_kv)
        for key in deleted:
            await self._kv.delete(key)
        self.passes += 1
        if put or deleted:
            log.info(
                "model fallbacks bucket repaired from the store",
                extra={"put": len(put), "deleted": len(deleted)},
            )
        return put, deleted

    async def _read_bucket(self) -> dict[str, ModelFallback | None]:
        """Every live key of the bucket: its record, or None where it is unreadable."""
        return await read_records(self._kv, ModelFallback, timeout_s=READ_TIMEOUT_S)
