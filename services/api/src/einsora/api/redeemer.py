"""Answers the access proxy's `access.redeem` requests from the store.

The proxy never reads the api's tables: it asks here, in a queue group, so several api replicas
share the work and each ticket is still redeemed at most once (the store decides).
"""

from __future__ import annotations

import logging

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from einsora.api.services import access
from einsora.api.store import Store
from einsora.common import logs
from einsora.common.bus import names
from einsora.common.schemas import AccessRedeemReply, AccessRedeemRequest

log = logging.getLogger("einsora.api.access")


class TicketRedeemer:
    """The `access.redeem` responder."""

    def __init__(self, store: Store, nc: NATS, clock: access.Clock) -> None:
        self._store = store
        self._nc = nc
        self._clock = clock
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(
            names.ACCESS_REDEEM_SUBJECT, queue=names.API_QUEUE_GROUP, cb=self._handle
        )

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _handle(self, msg: Msg) -> None:
        try:
            ask = AccessRedeemRequest.from_bytes(msg.data)
        except ValidationError:
            await msg.respond(AccessRedeemReply(ok=False, error="unreadable").to_bytes())
            return
        with logs.bind(request_id=ask.request_id, subject=ask.workload_id):
            try:
                reply = await access.redeem(self._store, ask, clock=self._clock)
            except Exception:
                log.exception("ticket redemption failed")
                reply = AccessRedeemReply(ok=False, error="unavailable")
            log.info("ticket redemption", extra={"ok": reply.ok, "why": reply.error})
            await msg.respond(reply.to_bytes())
