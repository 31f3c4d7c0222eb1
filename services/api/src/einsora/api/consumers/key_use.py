"""When each gateway key was last used: the gateway's token counts (`usage.tokens.*` on USAGE)
into `gateway_keys.last_used_at`, for the dashboard's and the CLI's list of keys (issue 18).

The gateway writes nothing to the store (it reads keys from KV and publishes one `TokenUsage`
per request); accounting sums the counts. The api keeps only the latest time per key, from a
durable pull consumer (`api-key-use`) with explicit acks: a fetched batch is one transaction
that moves each key's time forward, never back, so a message seen twice (or out of order)
changes nothing. A count on another tenant's subject than its own is refused for good.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from einsora.api import models as m
from einsora.api.store import Store
from einsora.common.bus import DurableConsumer, names
from einsora.common.errors import EinsoraError
from einsora.common.schemas import TokenUsage, what_is_wrong
from einsora.common.transient import is_store_transient

KEY_USE_CONSUMER = "api-key-use"


class KeyUseConsumer:
    """Consumes `usage.tokens.*` into each gateway key's `last_used_at`."""

    def __init__(
        self, store: Store, js: JetStreamContext, registry: CollectorRegistry | None = None
    ) -> None:
        self._store = store
        self._consumer = DurableConsumer(
            js,
            stream=names.USAGE.name,
            durable=KEY_USE_CONSUMER,
            filter_subject=names.USAGE.subjects[0],
            handler=self.handle,
            batch_handler=self.handle_batch,
            registry=registry,
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def handle(self, msg: Msg) -> None:
        await self._apply([msg])

    async def handle_batch(self, msgs: Sequence[Msg]) -> None:
        await self._apply(msgs)

    async def _apply(self, msgs: Sequence[Msg]) -> None:
        latest: dict[tuple[str, str], datetime] = {}
        for msg in msgs:
            usage = _usage_of(msg)
            key = (usage.tenant_id, usage.key_id)
            if key not in latest or latest[key] < usage.at:
                latest[key] = usage.at
        try:
            await self._store.run(lambda conn: _move_forward(conn, latest))
        except Exception as exc:
            if not is_store_transient(exc):
                raise  # a fault of ours: the consumer retries it too, with its traceback
            raise EinsoraError(f"store unavailable: {exc!r}", retryable=True) from exc


def _move_forward(conn: sa.Connection, latest: dict[tuple[str, str], datetime]) -> None:
    k = m.gateway_keys.c
    for (tenant_id, key_id), at in latest.items():
        conn.execute(
            sa.update(m.gateway_keys)
            .where(
                k.id == key_id,
                k.tenant_id == tenant_id,
                sa.or_(k.last_used_at.is_(None), k.last_used_at < at),
            )
            .values(last_used_at=at)
        )


def _usage_of(msg: Msg) -> TokenUsage:
    """The token count a message carries, or a non-retryable error saying why not."""
    try:
        usage = TokenUsage.from_bytes(msg.data)
    except ValidationError as exc:
        raise EinsoraError(f"not a token count: {what_is_wrong(exc)}", code="bad_usage") from exc
    try:
        expected = names.usage_tokens_subject(usage.tenant_id)
    except ValueError:
        expected = None
    if msg.subject != expected:
        raise EinsoraError(
            f"a count of tenant {usage.tenant_id!r} came on {msg.subject}", code="bad_usage"
        )
    return usage
