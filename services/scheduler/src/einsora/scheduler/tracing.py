"""The scheduler's part of a request's trace: its decision, and the desired-state write that
carries the decision to the machine (ADR-0020).

An intent's `traceparent` header is kept by intent id until the engine decides it; the decision
is a span in that trace, and the workload remembers the decision's context, so its events, its
place in the desired state (`DesiredWorkload.traceparent`, for the agent's spans) and the
desired-state write's own span all join the same trace. A desired state holds many workloads
and one write carries one `traceparent` header: the write's span is a child of the first
decision it carries and links to the others.

Everything here runs only while tracing is on (`telemetry.ON`): the engine and the projector
test that first, so a scheduler with tracing off pays a global's lookup per intent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

from nats.js.api import PubAck
from opentelemetry.trace import Span, SpanKind, StatusCode

from einsora.common import telemetry
from einsora.common.bus import names
from einsora.common.schemas import WorkloadIntent
from einsora.scheduler.book import Book, OutboxEvent

_NULL: AbstractContextManager[None] = contextlib.nullcontext()
_MAX_WAITING = 100_000
"""Intents' contexts kept at most, waiting for their decisions (far more than a fetch holds)."""


class SchedulerTracing:
    """Trace contexts of intents waiting for their decision."""

    def __init__(self) -> None:
        self._tracer = telemetry.tracer("einsora.scheduler")
        self.traceparents: dict[str, str] = {}
        """intent id → the `traceparent` its message carried (only while tracing is on)."""

    def remember(self, intent_id: str, traceparent: str | None) -> None:
        if traceparent:
            if len(self.traceparents) >= _MAX_WAITING:
                # Redelivered intents are never decided again: do not keep theirs for ever.
                self.traceparents.clear()
            self.traceparents[intent_id] = traceparent

    def decision(
        self, book: Book, intent: WorkloadIntent, request_id: str | None
    ) -> AbstractContextManager[None]:
        """The span of one intent's decision (current inside it); nothing while tracing is off."""
        if not telemetry.ON:
            return _NULL
        return self._decision(book, intent, request_id)

    @contextlib.contextmanager
    def _decision(
        self, book: Book, intent: WorkloadIntent, request_id: str | None
    ) -> Iterator[None]:
        parent = self.traceparents.pop(intent.intent_id, None)
        with telemetry.span(
            self._tracer,
            "scheduler decision",
            parent=parent,
            request_id=request_id,
            kind=SpanKind.CONSUMER,
            attributes={
                "einsora.workload_id": intent.workload_id,
                "einsora.intent": intent.action.value,
                "einsora.region": book.region,
            },
        ) as span:
            yield
            workload = book.workloads.get(intent.workload_id)
            if workload is not None:
                workload.traceparent = telemetry.traceparent_of(span)
                span.set_attribute("einsora.state", workload.state.value)
                if workload.machine_id:
                    span.set_attribute("einsora.machine_id", workload.machine_id)


def desired_traces(
    book: Book, events: Sequence[OutboxEvent], machine_ids: Sequence[str]
) -> dict[str, list[tuple[str, str]]]:
    """For each machine whose desired state is about to be written, the (traceparent, request
    id) of each decision it carries: those of the events queued with it."""
    wanted = set(machine_ids)
    traces: dict[str, list[tuple[str, str]]] = {}
    for e in events:
        if e.traceparent is None:
            continue
        workload = book.workloads.get(e.event.workload_id)
        if workload is None or workload.machine_id not in wanted:
            continue
        pairs = traces.setdefault(workload.machine_id, [])
        if all(tp != e.traceparent for tp, _ in pairs):
            pairs.append((e.traceparent, e.request_id))
    return traces


def desired_spans(
    desired: Sequence[tuple[str, int, bytes]], traces: dict[str, list[tuple[str, str]]]
) -> list[Span]:
    """One span per desired-state write, in the trace of the first decision it carries."""
    tracer = telemetry.tracer("einsora.scheduler")
    spans = []
    for machine_id, generation, _ in desired:
        carried = traces.get(machine_id, [])
        parent, request_id = carried[0] if carried else (None, None)
        spans.append(
            telemetry.start_span(
                tracer,
                "desired state write",
                parent=parent,
                request_id=request_id,
                kind=SpanKind.PRODUCER,
                attributes={
                    "einsora.machine_id": machine_id,
                    "einsora.generation": generation,
                    "messaging.destination.name": names.MACHINES.key_subject(
                        names.desired_key(machine_id)
                    ),
                },
                links=[tp for tp, _ in carried[1:]],
            )
        )
    return spans


def desired_headers(
    count: int, fence: dict[str, str] | None, spans: list[Span] | None
) -> list[dict[str, str] | None]:
    """The headers of each desired-state write: the leader's fence, and its span's context."""
    if spans is None:
        return [fence] * count
    headers: list[dict[str, str] | None] = []
    for span in spans:
        each = dict(fence or {})
        traceparent = telemetry.traceparent_of(span)
        if traceparent is not None:
            each[names.TRACEPARENT_HEADER] = traceparent
        headers.append(each or None)
    return headers


def end_spans(spans: list[Span], acks: Sequence[PubAck | BaseException]) -> None:
    """End each write's span when its ack (or failure) came: its length is the KV write lag."""
    for span, ack in zip(spans, acks, strict=False):
        if not isinstance(ack, PubAck):
            span.set_status(StatusCode.ERROR, repr(ack))
        span.end()
    for span in spans[len(acks) :]:
        span.end()
