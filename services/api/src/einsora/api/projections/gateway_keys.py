"""The `gateway_keys` bucket holds exactly the live gateway keys of the store, for the gateway.

The routes keep it so as they go: a new key is put once its unit commits (before the 201), a
revoked one deleted once its revocation commits (before the 204). A pass (kv.py) repairs the
rest, and runs as soon as the next key expires as well, so an expired key leaves the bucket on
time rather than up to a period late. A route's put of a new key is conditional on the key never
having been written, so a revocation that overtook it wins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import ValidationError

from einsora.api.errors import Unavailable
from einsora.api.projections.kv import KvProjection, ProjectionSync, SyncReport
from einsora.api.services.gateway_keys import live_keys
from einsora.api.store import Store
from einsora.common.bus import KeyState, names
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import GatewayKey, utcnow

log = logging.getLogger("einsora.api.gateway_keys")

SYNC_PERIOD_S = 60.0
"""How often a pass runs when nothing asks for one sooner."""


class GatewayKeysSync(ProjectionSync):
    """Writes gateway keys to KV for the routes, and repairs the bucket (see the module)."""

    def __init__(
        self,
        store: Store,
        nc: NATS,
        js: JetStreamContext,
        *,
        period_s: float = SYNC_PERIOD_S,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._clock = clock
        self._next_expiry: datetime | None = None

        async def rows() -> dict[str, GatewayKey]:
            live = await live_keys(store, clock())
            expiries = [k.expires_at for k in live.values() if k.expires_at is not None]
            self._next_expiry = min(expiries, default=None)
            return live

        def quiet(report: SyncReport, entries: dict[str, KeyState]) -> bool:
            # Expiries are the bucket's ordinary course; anything else is a repair.
            now = clock()
            return not report.put and all(_expired(entries[k], now) for k in report.deleted)

        super().__init__(
            KvProjection(
                nc,
                js,
                names.GATEWAY_KEYS,
                what="gateway keys sync",
                record=GatewayKey,
                key_of=names.gateway_key_key,
                rows=rows,
                period_s=period_s,
                due=self._until_next_expiry,
                quiet=quiet,
            ),
        )

    async def published(self, key: GatewayKey) -> None:
        """Put a key whose unit has just committed. A failure is logged, never raised: the key
        is stored, and the pass this asks for puts it as soon as the bus takes it."""
        try:
            self.projection.require_bus()
            # Only if the key was never written: a pass put it first, or it was revoked already,
            # and either way the bucket is right.
            await self.projection.put(key.key_id, key, only_new=True)
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "a new gateway key is not on the bus yet; the sync will put it",
                exc,
                {"key_id": key.key_id},
            )
            self.projection.wanted()

    async def revoked(self, key_id: str) -> None:
        """Delete a key whose revocation has just committed; the gateway refuses it from then
        on. Raises Unavailable when the bus does not take the delete (the sync retries it)."""
        try:
            self.projection.require_bus()
            await self.projection.delete(key_id)
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "a revoked gateway key could not be removed from the bus; the sync will",
                exc,
                {"key_id": key_id},
            )
            self.projection.wanted()
            raise Unavailable(
                "the key is revoked, but the gateway could not be told now (the bus did not "
                "answer); the gateway refuses it as soon as the api reaches the bus again"
            ) from None

    def _until_next_expiry(self) -> float | None:
        if self._next_expiry is None:
            return None
        # Just after it: the pass must see it expired.
        return (self._next_expiry - self._clock()).total_seconds() + 0.01


def _expired(entry: KeyState, now: datetime) -> bool:
    """Whether a bucket entry is a key that has expired by `now`."""
    try:
        key = GatewayKey.from_bytes(entry.value or b"")
    except ValidationError:
        return False
    return key.expires_at is not None and key.expires_at <= now
