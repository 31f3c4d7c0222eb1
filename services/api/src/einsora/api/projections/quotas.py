"""The `quota.*` keys of KV `usage` hold exactly the tenant quotas of the store, for the scheduler.

The route puts a tenant's quota once its PUT commits, before it answers (`published`). A pass
(kv.py) repairs the rest. The rest of the bucket, accounting's `tenant.*` keys, is never
touched here: it is only read, for a tenant's use (`usage`).
"""

from __future__ import annotations

import logging

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from einsora.api.errors import Unavailable
from einsora.api.projections.kv import KvProjection, ProjectionSync
from einsora.api.services.quotas import every_published, published
from einsora.api.store import Store
from einsora.common.bus import names
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import TenantQuota, TenantUsage

log = logging.getLogger("einsora.api.quotas")

SYNC_PERIOD_S = 60.0
"""How often a pass runs when nothing asks for one sooner."""

QUOTA_KEYS = "quota.*"


class QuotasSync(ProjectionSync):
    """Puts tenant quotas to KV for the routes, reads tenants' use, and repairs the bucket."""

    def __init__(
        self, store: Store, nc: NATS, js: JetStreamContext, *, period_s: float = SYNC_PERIOD_S
    ) -> None:
        self._store = store

        async def rows() -> dict[str, TenantQuota]:
            return await every_published(store)

        super().__init__(
            KvProjection(
                nc,
                js,
                names.USAGE_KV,
                what="tenant quotas sync",
                record=TenantQuota,
                key_of=names.tenant_quota_key,
                rows=rows,
                period_s=period_s,
                keys=QUOTA_KEYS,
            ),
        )

    async def published(self, tenant_id: str) -> None:
        """Put a tenant's quota whose PUT has just committed, so the scheduler holds to it from
        the answer on. Raises Unavailable when the bus does not take it (the sync retries)."""
        try:
            self.projection.require_bus()
            await self.projection.put_from_store(
                tenant_id, lambda: published(self._store, tenant_id)
            )
        except Exception as exc:
            if not outlives(exc, nats.errors.Error, SQLAlchemyError):
                raise
            log_failure(
                log,
                "a tenant's quota could not be put on the bus; the sync will",
                exc,
                {"tenant_id": tenant_id},
            )
            self.projection.wanted()
            raise Unavailable(
                "the quota is stored, but the scheduler could not be told now (the bus did not "
                "answer); it holds to it as soon as the api reaches the bus again"
            ) from None

    async def usage(self, tenant_id: str) -> TenantUsage | None:
        """What accounting last published of a tenant's use (None: nothing yet). Raises
        Unavailable when the bus cannot be read."""
        try:
            self.projection.require_bus()
            entry = await self.projection.kv.get(names.tenant_usage_key(tenant_id))
        except KeyNotFoundError:
            return None
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(log, "a tenant's use could not be read", exc)
            raise Unavailable(
                "the tenant's use could not be read from the bus now; retry shortly"
            ) from None
        try:
            return TenantUsage.from_bytes(entry.value or b"")
        except ValidationError:
            log.warning("a tenant's use on the bus is not readable", extra={"tenant_id": tenant_id})
            return None
