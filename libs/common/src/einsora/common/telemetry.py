"""Traces: OpenTelemetry, off unless the standard `OTEL_*` variables ask for it (ADR-0020).

One trace per API request. Its context crosses NATS in each message's `traceparent` header (KV
writes included), and every span carries the request's ID as `einsora.request_id`, so an
operator goes from a request ID in a log line to the whole story of that request: the HTTP
request, the outbox relay's publish, the scheduler's decision, the desired-state write, the
agent's driver action, its observed report and the timeline write.

Tracing is on when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`) or an OTLP
endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and
`OTEL_SDK_DISABLED` is not `true`. Everything else (the endpoint, headers, sampler, batch sizes,
`OTEL_SERVICE_NAME`, resource attributes) is the SDK's own reading of those variables.

Off (the default) it must cost nearly nothing on the launch path: hot code tests the module
global `ON` before it builds anything, and no tracer provider is installed, so the ASGI and
aiohttp instrumentations are not even added. One provider serves the whole process (Solo runs
every service in one); each service names its own tracer (`einsora.api`, `einsora.scheduler`,
...), the instrumentation scope an operator filters on.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from einsora.common import logs

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("einsora.telemetry")

REQUEST_ID_ATTRIBUTE = "einsora.request_id"
"""The span attribute that carries the request's ID (the one in `X-Request-ID`)."""

ON: bool = False
"""Whether spans are recorded in this process. Hot paths read it before anything else."""

_provider: TracerProvider | None = None
_parent_decides = False
"""Whether the sampler follows a parent's decision (the SDK's default, and every
`parentbased_*` choice): then a child of a sampled-out parent is not even made."""
_PROPAGATOR = TraceContextTextMapPropagator()
_TRUE = ("1", "true", "yes", "on")


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the `OTEL_*` variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(service: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on for this process when the environment asks for it (idempotent: Solo's
    services each call it, the first one installs the provider). Returns whether it is on."""
    if ON or not wanted(environ):
        return ON
    exporter = _exporter(environ)
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    install(BatchSpanProcessor(exporter), service_name=environ.get("OTEL_SERVICE_NAME", service))
    log.info("tracing on", extra={"exporter": type(exporter).__name__, "service_name": service})
    return True


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    # The HTTP/protobuf exporter: no gRPC stack in every service. It reads its endpoint,
    # headers, timeout and compression from OTEL_EXPORTER_OTLP_* itself.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def install(processor: SpanProcessor, *, service_name: str = "einsora") -> TracerProvider:
    """Record spans into `processor` from now on (tests pass an in-memory exporter's)."""
    global ON, _provider, _parent_decides
    from opentelemetry.sdk.resources import Resource

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(_RequestIdProcessor())
    provider.add_span_processor(processor)
    _provider = provider
    _parent_decides = isinstance(provider.sampler, ParentBased)
    ON = True
    return provider


def uninstall() -> None:
    """Stop recording (tests); spans still open are dropped with the provider."""
    global ON, _provider, _parent_decides
    provider, _provider, ON, _parent_decides = _provider, None, False, False
    if provider is not None:
        provider.shutdown()


def provider() -> TracerProvider | None:
    """The process's tracer provider while tracing is on (for the instrumentations)."""
    return _provider


def tracer(name: str) -> trace.Tracer:
    """The tracer of one service (`einsora.api`, ...); a no-op one while tracing is off."""
    if _provider is None:
        return trace.NoOpTracer()
    return _provider.get_tracer(name)


class _RequestIdProcessor(SpanProcessor):
    """Every span gets the request ID bound for logging where it starts (`logs.bind`), unless
    it was given one: the instrumentations' spans carry it too."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        attributes = getattr(span, "attributes", None)
        if attributes is not None and REQUEST_ID_ATTRIBUTE in attributes:
            return
        request_id = logs.bound().get("request_id")
        if request_id:
            span.set_attribute(REQUEST_ID_ATTRIBUTE, request_id)

    def on_end(self, span: ReadableSpan) -> None:
        pass


# --- trace context on messages ------------------------------------------------------------


def traceparent_of(span: Span | SpanContext | None) -> str | None:
    """The W3C `traceparent` of a span (or span context), None when it is not valid."""
    context = span.get_span_context() if isinstance(span, Span) else span
    if context is None or not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def current_traceparent() -> str | None:
    """The `traceparent` of the span current here, while tracing is on; else None."""
    if not ON:
        return None
    return traceparent_of(trace.get_current_span())


def context_of(traceparent: str | None) -> Context | None:
    """The context a `traceparent` value names (None for none, or a malformed one)."""
    if not traceparent:
        return None
    context = _PROPAGATOR.extract({"traceparent": traceparent})
    span_context = trace.get_current_span(context).get_span_context()
    return context if span_context.is_valid else None


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""A version-00 W3C `traceparent`: lower-case hex only (`int(…, 16)` alone takes `_`, signs and
spaces too)."""


def sampled_out(parent: str | None) -> Span | None:
    """The parent's own context as a span that records nothing, when `parent` (a `traceparent`)
    was sampled out and the sampler follows the parent; else None.

    Its child would record nothing either, so it is not made: no context extraction, sampler
    call, ids or attributes per message. What the child's context would have carried on (the
    trace id, the not-sampled flag) is the parent's already. With 10 % of requests sampled, this
    is what the other 90 % cost on the bus's side of the trace (ADR-0020)."""
    if not _parent_decides or parent is None:
        return None
    found = _TRACEPARENT.fullmatch(parent)
    if found is None:
        return None  # malformed: the propagator starts a fresh trace for it, as it would
    trace_flags = int(found[3], 16)
    context = SpanContext(int(found[1], 16), int(found[2], 16), is_remote=True)
    if trace_flags & TraceFlags.SAMPLED or not context.is_valid:
        return None
    return NonRecordingSpan(context)


def link_to(traceparent: str) -> Link | None:
    """A span link to the span a `traceparent` names."""
    context = context_of(traceparent)
    if context is None:
        return None
    return Link(trace.get_current_span(context).get_span_context())


@contextmanager
def span(
    tracer_: trace.Tracer,
    name: str,
    *,
    parent: str | None = None,
    request_id: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[str] = (),
) -> Iterator[Span]:
    """A span, current inside the block: child of `parent` (a `traceparent`) when given, else of
    the current span. Call it only while `ON` (hot paths test that first)."""
    skipped = sampled_out(parent)
    if skipped is not None:
        with trace.use_span(skipped, end_on_exit=False):
            yield skipped
        return
    context = context_of(parent) if parent else None
    all_attributes = dict(attributes or {})
    if request_id:
        all_attributes[REQUEST_ID_ATTRIBUTE] = request_id
    linked = [link for link in (link_to(p) for p in links) if link is not None]
    with tracer_.start_as_current_span(
        name, context=context, kind=kind, attributes=all_attributes, links=linked
    ) as current:
        yield current


def start_span(
    tracer_: trace.Tracer,
    name: str,
    *,
    parent: str | None = None,
    request_id: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[str] = (),
) -> Span:
    """A span that the caller ends (`span.end()`), not made current: for a write whose ack
    comes later, such as a pipelined publish."""
    skipped = sampled_out(parent)
    if skipped is not None:
        return skipped
    context = context_of(parent) if parent else None
    all_attributes = dict(attributes or {})
    if request_id:
        all_attributes[REQUEST_ID_ATTRIBUTE] = request_id
    linked = [link for link in (link_to(p) for p in links) if link is not None]
    return tracer_.start_span(
        name, context=context, kind=kind, attributes=all_attributes, links=linked
    )


__all__ = [
    "REQUEST_ID_ATTRIBUTE",
    "configure",
    "context_of",
    "current_traceparent",
    "install",
    "provider",
    "sampled_out",
    "span",
    "start_span",
    "traceparent_of",
    "tracer",
    "uninstall",
    "wanted",
]
