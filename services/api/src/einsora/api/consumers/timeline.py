"""The timeline consumer: workload events from EVENTS into the store.

A durable pull consumer (`api-timeline`) with explicit acks: a fetched batch of events is
committed in one transaction, and each is acked once committed; one the store cannot take now
is retried with back-off; one that is not a workload event, or came on another workload's
subject, is refused for good (it can never be handled). Events need not come in order (a killed
api's unacked ones come back after `ack_wait_s`, behind later ones): `apply_events` puts each
workload's in `seq` order.
When NATS comes back without the durable (a wiped server), `restart_if_gone` declares it again
and the timeline catches up from the start of EVENTS (anti-entropy, ADR-0011).
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from opentelemetry.trace import Span, SpanKind, StatusCode
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from einsora.api.services.timeline import apply_events
from einsora.api.store import Store
from einsora.common import telemetry
from einsora.common.bus import DurableConsumer, names, request_id_of, traceparent_of
from einsora.common.errors import EinsoraError
from einsora.common.schemas import WorkloadEvent, what_is_wrong
from einsora.common.transient import is_store_transient

TIMELINE_CONSUMER = "api-timeline"


class TimelineConsumer:
    """Consumes `event.workload.*` into the timeline and the workloads' states."""

    def __init__(
        self,
        store: Store,
        js: JetStreamContext,
        registry: CollectorRegistry | None = None,
        *,
        ack_wait_s: float = 30.0,
    ) -> None:
        self._store = store
        self._js = js
        self._consumer = DurableConsumer(
            js,
            stream=names.EVENTS.name,
            durable=TIMELINE_CONSUMER,
            filter_subject=names.EVENTS_FILTER,
            handler=self.handle,
            # What a killed api held comes back this long after, behind the events that
            # followed it: `apply_events` takes them in `seq` order all the same.
            ack_wait=ack_wait_s,
            # A fetched batch is one unit of work: one transaction for many events.
            batch_handler=self.handle_batch,
            registry=registry,  # its redeliveries and terminations on the api's /metrics
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def restart_if_gone(self) -> bool:
        """Declare the durable again and consume from it when the server no longer has it;
        True when it had to. Raises when NATS cannot be asked."""
        try:
            await self._js.consumer_info(names.EVENTS.name, TIMELINE_CONSUMER)
        except NotFoundError:
            # The running loop is bound to the consumer that is gone and would fail for ever.
            await self._consumer.stop()
            await self._consumer.start()
            return True
        return False

    async def handle(self, msg: Msg) -> None:
        await self._apply([msg])

    async def handle_batch(self, msgs: Sequence[Msg]) -> None:
        """Every event of a fetched batch in one transaction. One that cannot be handled fails
        the batch, which the consumer then handles message by message (refusing just that one)."""
        await self._apply(msgs)

    async def _apply(self, msgs: Sequence[Msg]) -> None:
        events = [(_event_of(msg), request_id_of(msg.headers)) for msg in msgs]
        spans = _write_spans(msgs, events) if telemetry.ON else None
        try:
            await apply_events(self._store, events)
        except Exception as exc:
            if spans is not None:
                _end(spans, exc)
            if not is_store_transient(exc):
                raise  # a fault of ours: the consumer retries it too, with its traceback
            raise EinsoraError(f"store unavailable: {exc!r}", retryable=True) from exc
        if spans is not None:
            _end(spans, None)


def _write_spans(
    msgs: Sequence[Msg], events: Sequence[tuple[WorkloadEvent, str | None]]
) -> list[Span]:
    """One span per event written, in the trace its message carries (tracing on only)."""
    tracer = telemetry.tracer("einsora.api")
    return [
        telemetry.start_span(
            tracer,
            "timeline write",
            parent=traceparent_of(msg.headers),
            request_id=request_id,
            kind=SpanKind.CONSUMER,
            attributes={
                "einsora.workload_id": event.workload_id,
                "einsora.event": f"{event.kind.value} {event.state.value}",
            },
        )
        for msg, (event, request_id) in zip(msgs, events, strict=True)
    ]


def _end(spans: list[Span], error: BaseException | None) -> None:
    for span in spans:
        if error is not None:
            span.set_status(StatusCode.ERROR, repr(error))
        span.end()


def _event_of(msg: Msg) -> WorkloadEvent:
    """The workload event a message carries, or a non-retryable error saying why not."""
    try:
        event = WorkloadEvent.from_bytes(msg.data)
    except ValidationError as exc:
        raise EinsoraError(f"not a workload event: {what_is_wrong(exc)}", code="bad_event") from exc
    try:
        expected = names.event_subject(event.workload_id)
    except ValueError:
        expected = None
    if msg.subject != expected:
        raise EinsoraError(
            f"event for {event.workload_id!r} came on {msg.subject}", code="bad_event"
        )
    return event
