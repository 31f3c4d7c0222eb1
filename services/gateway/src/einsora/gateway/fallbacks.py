"""Endpoints' model fallbacks: where a request for a model goes when no replica of it answers.

An endpoint launched with `{"model": …}` steps in its fallback chain (ADR-0022) names other
endpoints of its tenant, in order; the api writes them to the `model_fallbacks` bucket, keyed
by the endpoint's id, and this table mirrors it by (tenant, model name). The gateway tries a
fallback only once no replica of the asked model answered (none running, or each failed before
a byte reached the client), and only a model the request's key may use.
"""

from __future__ import annotations

import logging

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import ValidationError

from einsora.common.bus import KvMirror, names
from einsora.common.schemas import ModelFallback

log = logging.getLogger("einsora.gateway.fallbacks")

AUDIT_S = 30.0


class ModelFallbacks:
    """Each endpoint's fallback models by (tenant, model), kept current by a KV mirror."""

    def __init__(self, *, audit_s: float = AUDIT_S) -> None:
        self._audit_s = audit_s
        self._records: dict[str, ModelFallback] = {}
        self._by_model: dict[tuple[str, str], tuple[str, ...]] = {}
        self._mirror: KvMirror | None = None

    def of(self, tenant_id: str, model: str) -> tuple[str, ...]:
        """The models to try, in order, when none of `model`'s replicas answers."""
        return self._by_model.get((tenant_id, model), ())

    async def start(self, nc: NATS, js: JetStreamContext, *, sync_timeout_s: float) -> None:
        self._mirror = KvMirror(
            nc,
            js,
            names.MODEL_FALLBACKS,
            on_put=self._put,
            on_delete=self._delete,
            audit_s=self._audit_s,
        )
        try:
            await self._mirror.start(sync_timeout_s=sync_timeout_s)
        except TimeoutError:
            log.warning("model fallbacks not loaded yet (the api creates the bucket)")

    async def stop(self) -> None:
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            await mirror.stop()

    def _put(self, key: str, value: bytes) -> None:
        try:
            record = ModelFallback.from_bytes(value)
        except ValidationError:
            log.warning("unreadable model fallback ignored", extra={"workload": key})
            self._delete(key)
            return
        self._records[key] = record
        self._reindex()

    def _delete(self, key: str) -> None:
        if self._records.pop(key, None) is not None:
            self._reindex()

    def _reindex(self) -> None:
        # Changes are rare and requests many: each request reads a ready tuple. One live
        # endpoint per name and tenant, so the latest record of a (tenant, model) is its own.
        self._by_model = {
            (r.tenant_id, r.model): tuple(r.fallback)
            for r in sorted(self._records.values(), key=lambda r: r.workload_id)
        }
