"""Answers the access proxy's `access.redeem` requests from the store.

The proxy never reads the api's tables: it asks here, in a queue group, so several api replicas
share the work and each ticket is still redeemed at most once (the store decides). Each
redemption of a known ticket is an entry of its tenant's activity log, written in the
redemption's own transaction (`store.Action`, bound here as the edge binds a request's).
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from einsora.api.services import access
from einsora.api.services.activity import REDEEM_ACTION, REDEEM_ROUTE
from einsora.api.store import Action, Store, bound, settle
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
        request_id = ask.request_id[:64]
        action = Action(request_id, "", asyncio.current_task())
        action.arm(
            self._store,
            name=REDEEM_ACTION,
            route=REDEEM_ROUTE,
            at=self._clock(),
            status=access.REDEEMED_STATUS,
            target=ask.workload_id,
        )
        with logs.bind(request_id=ask.request_id, subject=ask.workload_id):
            try:
                with bound(action):
                    reply = await access.redeem(self._store, ask, clock=self._clock)
            except Exception:
                log.exception("ticket redemption failed")
                reply = AccessRedeemReply(ok=False, error="unavailable")
            status = access.REDEEMED_STATUS if reply.ok else access.REFUSED_STATUS
            await settle(action, 503 if reply.error == "unavailable" else status)
            log.info("ticket redemption", extra={"ok": reply.ok, "why": reply.error})
            await msg.respond(reply.to_bytes())
