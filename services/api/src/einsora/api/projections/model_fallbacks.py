"""The `model_fallbacks` bucket holds each live endpoint's model steps, for the gateway.

An endpoint launched with `{"model": …}` steps in its fallback chain (ADR-0022) is put there
once its launch commits (before the 201), keyed by the endpoint's id. The gateway sends a
request for the endpoint's model to those models, in order, when no replica of it answers. A
pass (kv.py) repairs the rest: an endpoint removed since, a crash, a bus that came back empty.
"""

from __future__ import annotations

import json
import logging

import nats.errors
import sqlalchemy as sa
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from einsora.api import models as m
from einsora.api.projections.kv import KvProjection, ProjectionSync
from einsora.api.store import Store
from einsora.common.bus import names
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import ModelFallback

log = logging.getLogger("einsora.api.model_fallbacks")

SYNC_PERIOD_S = 60.0

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


class ModelFallbacksSync(ProjectionSync):
    """Puts endpoints' model steps into KV, and repairs the bucket (see the module)."""

    def __init__(
        self, store: Store, nc: NATS, js: JetStreamContext, *, period_s: float = SYNC_PERIOD_S
    ) -> None:
        async def rows() -> dict[str, ModelFallback]:
            found = await store.query(lambda conn: conn.execute(_WITH_MODEL_STEPS).all())
            records = (
                model_fallback(r.id, r.tenant_id, r.name, json.loads(r.fallback)) for r in found
            )
            return {record.workload_id: record for record in records if record is not None}

        super().__init__(
            KvProjection(
                nc,
                js,
                names.MODEL_FALLBACKS,
                what="model fallbacks sync",
                record=ModelFallback,
                key_of=names.model_fallback_key,
                rows=rows,
                period_s=period_s,
            ),
            first_now=True,
        )

    async def put(self, record: ModelFallback) -> None:
        """Write one record now; a failure is left to the next pass (asked for at once)."""
        try:
            await self.projection.put(record.workload_id, record)
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "an endpoint's model fallbacks did not reach the bus; the sync will put them",
                exc,
                {"workload_id": record.workload_id},
            )
            self.projection.wanted()
