"""The transactional outbox: intents are written with the change that causes them, then
published to INTENTS by a relay.

A state-changing call writes its workload row, its timeline entry and an outbox row in one
transaction (`outbox_row`), so a committed change always has its intent, and NATS being down never
fails the call. The relay publishes unsent rows in id order with `Nats-Msg-Id` = the intent id
(JetStream drops a republished duplicate), then marks them sent. It wakes on every commit that
wrote a row, and polls as well, so rows written by another replica or left by an outage go out.

A sent row is kept a day, and for as long as its workload waits on the scheduler (pending,
parking, removing): anti-entropy republishes it from here if the bus loses it (ADR-0011).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import nats.errors
import sqlalchemy as sa
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from opentelemetry.trace import Span, SpanKind, StatusCode
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import SQLAlchemyError

from einsora.api import models as m
from einsora.api.store import Store
from einsora.common import lifecycle, telemetry
from einsora.common.bus import message_headers, names
from einsora.common.bus.batch import BatchPublisher, Message
from einsora.common.errors import BusUnavailable
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import WorkloadIntent, WorkloadState, utcnow

log = logging.getLogger("einsora.api.consumers.outbox")


def outbox_row(
    intent: WorkloadIntent, *, request_id: str, traceparent: str | None = None
) -> dict[str, Any]:
    """The outbox row that publishes `intent`."""
    return {
        "intent_id": intent.intent_id,
        "subject": names.intent_subject(intent.region, intent.workload_id),
        "payload": intent.to_bytes().decode(),
        "request_id": request_id,
        "traceparent": traceparent,
        "created_at": intent.at,
    }


AWAITING_INTENT: frozenset[WorkloadState] = frozenset(
    {WorkloadState.pending, *(rule.requested for rule in lifecycle.ACTIONS.values())}
)
"""The states the api records itself, on a launch (pending) or an action (lifecycle's
`requested`: parking, pending, removing): the workload waits for the scheduler to act on its
intent, and only the scheduler's events move it on."""


def _awaiting_subjects() -> sa.Select[str]:
    """The intent subjects of the workloads waiting on an intent (`names.intent_subject`,
    spelled in SQL so prune needs no list of them)."""
    w = m.workloads.c
    region = sa.func.coalesce(w.current_region, w.region)  # where its intents go (ADR-0022)
    return sa.select(sa.literal("intent.") + region + sa.literal(".workload.") + w.id).where(
        w.state.in_(sorted(s.value for s in AWAITING_INTENT))
    )


_UNSENT = (
    sa.select(
        m.outbox.c.id,
        m.outbox.c.intent_id,
        m.outbox.c.subject,
        m.outbox.c.payload,
        m.outbox.c.request_id,
        m.outbox.c.traceparent,
    )
    .where(m.outbox.c.sent_at.is_(None))
    .order_by(m.outbox.c.id)
    .limit(sa.bindparam("batch"))
)


def _publish_spans(rows: Sequence[Any]) -> list[Span]:
    """One producer span per intent, in its request's trace (tracing on only)."""
    tracer = telemetry.tracer("einsora.api")
    return [
        telemetry.start_span(
            tracer,
            "outbox publish intent",
            parent=row.traceparent,
            request_id=row.request_id,
            kind=SpanKind.PRODUCER,
            attributes={"messaging.system": "nats", "messaging.destination.name": row.subject},
        )
        for row in rows
    ]


def _end_spans(spans: list[Span], acks: Sequence[PubAck | BaseException]) -> None:
    for span, ack in zip(spans, acks, strict=False):
        if isinstance(ack, BaseException):
            span.set_status(StatusCode.ERROR, repr(ack))
        span.end()
    for span in spans[len(acks) :]:
        span.end()


class OutboxRelay:
    """Publishes the outbox to INTENTS: in order, at least once, de-duplicated by intent id."""

    def __init__(
        self,
        store: Store,
        nc: NATS,
        js: JetStreamContext,
        *,
        batch: int = 500,
        poll_s: float = 1.0,
        ack_timeout_s: float = 5.0,
        retain: timedelta = timedelta(days=1),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._store = store
        self._nc = nc
        self._js = js
        self._batch = batch
        self._poll_s = poll_s
        self._ack_timeout_s = ack_timeout_s
        self._retain = retain
        self.intents_out = BatchPublisher(
            nc, js, stream=names.INTENTS.name, timeout_s=ack_timeout_s, registry=registry
        )
        """A burst's rows go out as atomic batches, one commit each (bus/batch.py)."""
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.published = 0
        """Rows published and marked sent since start (for tests and benchmarks)."""

    async def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="outbox relay")

    async def stop(self) -> None:
        self._stopping.set()
        self._store.outbox_written.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 10)
            except TimeoutError:
                log.warning("outbox relay did not stop in time")

    async def _run(self) -> None:
        failing = False
        pruned_at = utcnow() - self._retain
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._store.outbox_written.wait(), self._poll_s)
            self._store.outbox_written.clear()
            if self._stopping.is_set():
                break
            try:
                await self.drain()
                if utcnow() - pruned_at > timedelta(minutes=10):
                    await self.prune()
                    pruned_at = utcnow()
            except Exception as exc:
                # Transient failures, and refusals by the bus or the store (logged with their
                # traceback), are retried; anything else ends the relay, as a bug should.
                if not outlives(exc, nats.errors.Error, SQLAlchemyError):
                    raise
                if not failing:
                    # The bus's failures are its own errors; a connection refused (OSError) is
                    # the store's, which the relay reads before it publishes anything.
                    bus = isinstance(exc, (BusUnavailable, nats.errors.Error))
                    said = "intents wait for NATS" if bus else "outbox unreadable"
                    log_failure(log, f"{said}; will retry", exc)
                failing = True
                continue
            if failing:
                log.info("outbox relay publishing again")
                failing = False

    async def drain(self) -> int:
        """Publish every unsent row now; the number published. Raises when the bus fails."""
        total = 0
        while True:
            rows = await self._store.query(self._unsent)
            if not rows:
                return total
            if not self._nc.is_connected:
                raise BusUnavailable("not connected to NATS")
            spans = _publish_spans(rows) if telemetry.ON else None
            messages: list[Message] = []
            for i, row in enumerate(rows):
                traceparent = row.traceparent
                if spans is not None:
                    traceparent = telemetry.traceparent_of(spans[i]) or traceparent
                headers = message_headers(
                    request_id=row.request_id, msg_id=row.intent_id, traceparent=traceparent
                )
                messages.append((row.subject, row.payload.encode(), headers))
            try:
                acks = await self.intents_out.publish(messages)
            except BaseException:
                if spans is not None:
                    for span in spans:
                        span.end()
                raise  # the rows stay unsent and go out again, de-duplicated
            if spans is not None:
                _end_spans(spans, acks)
            # Only the rows before the first failure count as sent, so a retry keeps the order
            # (JetStream drops any later row it already stored, by its Nats-Msg-Id).
            sent = 0
            failure: BaseException | None = None
            for ack in acks:
                if isinstance(ack, BaseException):
                    failure = ack
                    break
                sent += 1
            if sent:
                await self._mark_sent([row.id for row in rows[:sent]])
                total += sent
                self.published += sent
            if failure is not None:
                raise BusUnavailable(f"publishing intents failed: {failure!r}") from failure

    def _unsent(self, conn: sa.Connection) -> Sequence[Any]:
        return conn.execute(_UNSENT, {"batch": self._batch}).all()

    async def _mark_sent(self, ids: list[int]) -> None:
        sent = sa.update(m.outbox).where(m.outbox.c.id.in_(ids)).values(sent_at=utcnow())
        await self._store.run(lambda conn: conn.execute(sent))

    async def prune(self) -> None:
        """Forget rows sent longer ago than `retain`, but those of workloads still waiting on
        their intents (anti-entropy may need to publish them again)."""
        async with self._store.write() as conn:
            await conn.execute(
                sa.delete(m.outbox).where(
                    m.outbox.c.sent_at < utcnow() - self._retain,
                    m.outbox.c.subject.not_in(_awaiting_subjects()),
                )
            )
