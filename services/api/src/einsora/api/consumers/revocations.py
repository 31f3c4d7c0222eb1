"""Revoked credentials leave every api replica's cache of verified ones at once.

API tokens and dashboard sessions share that cache (`auth.VerifiedTokens`), so both travel here:
a token revoked, a session signed out or ended by a password change, every credential of a
member removed from a tenant or offboarded, and the credentials of a member whose role changed
(forgotten, not revoked: the next request reads the new role from the store; issue 34, N11).
The replica that revokes drops them itself before it answers, then tells the others on
`api.tokens.revoked` (core NATS: a replica that misses it was disconnected, and one that
reconnects forgets every verified credential, so a missed message never keeps one alive; the
cache's TTL is the last backstop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from einsora.api.auth import VerifiedTokens
from einsora.common.bus import names, reconnects
from einsora.common.failures import log_failure, outlived, outlives
from einsora.common.schemas import TokensRevoked

log = logging.getLogger("einsora.api.consumers.revocations")


class Revocations:
    """Announces this replica's revocations and applies the other replicas'."""

    def __init__(self, tokens: VerifiedTokens) -> None:
        self._tokens = tokens
        self._nc: NATS | None = None
        self._sub: Subscription | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self, nc: NATS) -> None:
        self._nc = nc
        self._sub = await nc.subscribe(names.TOKENS_REVOKED_SUBJECT, cb=self._received)
        self._watch = asyncio.create_task(self._watch_reconnects(nc), name="token revocations")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        if self._sub is not None:
            with outlived(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None

    async def _watch_reconnects(self, nc: NATS) -> None:
        """When the bus goes and when it comes back, forget every verified token: a revocation
        may be missed in between."""
        signal = reconnects(nc)
        while True:
            await signal.changed()
            self._tokens.clear()

    async def revoked(self, token_ids: Sequence[str]) -> None:
        """Drop these credentials (token or session ids) here, then tell the other replicas
        (flushed before it returns, so the server has the message before the caller answers)."""
        self._tokens.forget(token_ids)
        if self._nc is None or not self._nc.is_connected:
            log.warning(
                "revocation not announced (no bus); other replicas drop the token within the "
                "cache's TTL or when they reconnect",
                extra={"tokens": len(token_ids), "ttl_s": self._tokens.ttl_s},
            )
            return
        try:
            message = TokensRevoked(token_ids=list(token_ids))
            await self._nc.publish(names.TOKENS_REVOKED_SUBJECT, message.to_bytes())
            await self._nc.flush(timeout=2)
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(log, "revocation not announced", exc)

    async def _received(self, msg: Msg) -> None:
        try:
            message = TokensRevoked.from_bytes(msg.data)
        except ValidationError:
            log.warning("unreadable token revocation ignored")
            return
        self._tokens.forget(message.token_ids)
