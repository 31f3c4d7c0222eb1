"""Tracing is off unless the standard OTEL_* variables ask for it, and a message carries the
trace context of what caused it: the sending span's while on, the caller's own while off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from einsora.common import logs, telemetry
from einsora.common.bus import message_headers, names

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
            False,
        ),
    ],
)
def test_the_environment_decides_whether_to_trace(environ: dict[str, str], on: bool) -> None:
    assert telemetry.wanted(environ) is on


def test_off_by_default_a_message_carries_its_callers_context() -> None:
    assert not telemetry.ON
    assert telemetry.configure("einsora-test", {}) is False
    headers = message_headers(request_id="r-1", traceparent=CALLER)
    assert headers[names.TRACEPARENT_HEADER] == CALLER
    fresh = message_headers(request_id="r-1")[names.TRACEPARENT_HEADER]
    assert fresh != CALLER
    assert telemetry.context_of(fresh) is not None


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    telemetry.install(SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        telemetry.uninstall()


def test_on_a_message_carries_the_sending_spans_context_and_spans_the_request_id(
    exporter: InMemorySpanExporter,
) -> None:
    tracer = telemetry.tracer("einsora.test")
    with logs.bind(request_id="r-2"), telemetry.span(tracer, "send", parent=CALLER) as span:
        headers = message_headers(request_id="r-2", traceparent=CALLER)
    assert headers[names.TRACEPARENT_HEADER] == telemetry.traceparent_of(span)
    (finished,) = exporter.get_finished_spans()
    assert finished.context is not None
    assert finished.parent is not None
    assert f"{finished.context.trace_id:032x}" == CALLER.split("-")[1]
    assert f"{finished.parent.span_id:016x}" == CALLER.split("-")[2]
    assert finished.attributes is not None
    assert finished.attributes[telemetry.REQUEST_ID_ATTRIBUTE] == "r-2"


SAMPLED_OUT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


def test_a_sampled_out_parents_children_are_not_made_and_carry_its_context_on(
    exporter: InMemorySpanExporter,
) -> None:
    tracer = telemetry.tracer("einsora.test")
    with telemetry.span(tracer, "decide", parent=SAMPLED_OUT) as span:
        assert not span.is_recording()
        # What the child sends on is the parent's context: the same trace, still not sampled.
        headers = message_headers(request_id="r-3", traceparent="ignored")
    assert headers[names.TRACEPARENT_HEADER] == SAMPLED_OUT
    write = telemetry.start_span(tracer, "write", parent=SAMPLED_OUT)
    assert telemetry.traceparent_of(write) == SAMPLED_OUT
    write.end()
    assert exporter.get_finished_spans() == ()
    # A sampled parent's child is recorded as before.
    with telemetry.span(tracer, "decide", parent=CALLER) as span:
        assert span.is_recording()
    assert [s.name for s in exporter.get_finished_spans()] == ["decide"]


@pytest.mark.parametrize(
    "parent",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # sampled
        "00-00000000000000000000000000000000-00f067aa0ba902b7-00",  # invalid trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-00",  # invalid span id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-00",  # not hex
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa_ba902b7-00",  # int() takes `_`
        "00-4bf92f3577b34da6a3ce929d0e0e4736-+0f067aa0ba902b7-00",  # and a sign
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7- 0",  # and spaces
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00",  # upper case: not W3C's
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",  # another version
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_00",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-",
        "",
        None,
    ],
)
def test_only_a_well_formed_sampled_out_parent_is_skipped(
    exporter: InMemorySpanExporter, parent: str | None
) -> None:
    assert telemetry.sampled_out(parent) is None


def test_a_sampler_that_ignores_the_parent_still_decides_each_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    exporter = InMemorySpanExporter()
    telemetry.install(SimpleSpanProcessor(exporter))
    try:
        assert telemetry.sampled_out(SAMPLED_OUT) is None
        with telemetry.span(telemetry.tracer("einsora.test"), "decide", parent=SAMPLED_OUT):
            pass
    finally:
        telemetry.uninstall()
    (span,) = exporter.get_finished_spans()
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == SAMPLED_OUT.split("-")[2]
