"""Publishing each request's token counts on `usage.tokens.<tenant>`, off the request's path.

A request only appends a record to a queue; a background task publishes through JetStream (with
`Nats-Msg-Id` = the request ID, so a retried publish is stored once) and keeps a record until
the stream acknowledged it, retrying while the bus is away. Records go in batches: the first
waits a couple of milliseconds for others, all are sent in one write, and their acks are awaited
together, so a busy gateway pays one bus round trip per batch rather than per request. The
answer never waits for the bus, and no record is dropped while the process lives; at shutdown
the queue is drained for a few seconds, and what is left then is logged with its count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck

from einsora.common.bus import message_headers, names
from einsora.common.failures import log_failure, outlives
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import CountSource, TokenUsage
from einsora.common.schemas.endpoint import CountCap

log = logging.getLogger("einsora.gateway.usage")

BATCH = 256
"""Publishes in flight at once."""
LINGER_S = 0.002
"""How long the first record of a batch waits for others. Measured with bench/gateway.py: 2 ms
batches enough to spare the bus a round trip per request, while 20 ms made batches whose
encoding stalled the loop long enough to double the added p99."""
RETRY_S = 0.5
DRAIN_S = 5.0


@dataclass(slots=True)
class UsageRecord:
    """One request's counts, as cheap to make as a tuple; the message is built off the path."""

    request_id: str
    tenant_id: str
    key_id: str
    endpoint: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    source: CountSource
    status: int
    at: float
    """Unix seconds."""
    capped: tuple[CountCap, ...] = ()
    """The counts capped to make them sane (`einsora.gateway.caps`), and what was claimed."""

    def message(self) -> TokenUsage:
        return TokenUsage(
            request_id=self.request_id,
            tenant_id=self.tenant_id,
            key_id=self.key_id,
            endpoint=self.endpoint,
            model=self.model,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            source=self.source,
            status=self.status,
            at=datetime.fromtimestamp(self.at, UTC),
            capped=list(self.capped),
        )


class UsagePublisher:
    """A queue of usage records and the task that publishes them until acknowledged."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        ack_timeout_s: float = 5.0,
        on_record: Callable[[UsageRecord], None] | None = None,
    ) -> None:
        self._js = js
        self._on_record = on_record
        self._ack_timeout_s = ack_timeout_s
        self._queue: deque[UsageRecord] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        self._task: asyncio.Task[None] | None = None
        self.published = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway usage publisher")

    def put(self, record: UsageRecord) -> None:
        """Queue a record (returns at once)."""
        if self._on_record is not None:
            self._on_record(record)
        self._queue.append(record)
        self._idle.clear()
        self._wake.set()

    @property
    def pending(self) -> int:
        """Records not yet acknowledged by the stream."""
        return len(self._queue) + self._in_flight

    async def stop(self, *, drain_s: float = DRAIN_S) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self.pending:
            log.error("usage records not published at shutdown", extra={"records": self.pending})

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                # Let a few more records join: one write and one wake-up of the server for a
                # batch, rather than a round trip per request beside the requests themselves.
                await asyncio.sleep(LINGER_S)
            batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
            self._in_flight = len(batch)
            try:
                failed, error = await self._publish_batch(batch)
            finally:
                self._in_flight = 0
            if failed:
                # Back at the front, in order: the bus is away; try again shortly.
                self._queue.extendleft(reversed(failed))
                log_failure(log, "usage publish failed; retrying", error, {"records": len(failed)})
                await asyncio.sleep(RETRY_S)

    async def _publish_batch(
        self, batch: list[UsageRecord]
    ) -> tuple[list[UsageRecord], BaseException]:
        """Publish every record, then wait for the acks together; the records not acknowledged
        (and why the last of them was not)."""
        sent: list[tuple[UsageRecord, asyncio.Future[PubAck]]] = []
        failed: list[UsageRecord] = []
        error: BaseException = TimeoutError("no acknowledgement in time")
        for index, record in enumerate(batch):
            try:
                payload = record.message().to_bytes()
            except ValueError:
                # Cannot happen with the gateway's own counts; retrying would not mend it.
                log.exception("unpublishable usage record dropped")
                continue
            headers = message_headers(request_id=record.request_id, msg_id=record.request_id)
            try:
                future = await self._js.publish_async(
                    names.usage_tokens_subject(record.tenant_id), payload, headers=headers
                )
            except Exception as exc:
                if not outlives(exc, nats.errors.Error):  # a refusal: retried, with its traceback
                    raise
                failed.extend(batch[index:])
                error = exc
                break
            sent.append((record, future))
        if sent:
            await asyncio.wait([f for _, f in sent], timeout=self._ack_timeout_s)
        for record, future in sent:
            if not future.done():
                future.cancel()
                failed.append(record)
                error = TimeoutError("no acknowledgement in time")
            elif future.cancelled():
                failed.append(record)
            elif (refused := future.exception()) is not None:
                failed.append(record)
                error = refused
            else:
                self.published += 1
        return failed, error
