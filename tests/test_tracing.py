"""One launch through a real Solo is one trace: from the API request to the agent's report.

The whole control plane runs in this process with tracing on, its spans captured by the SDK's
in-memory exporter (in place of an OTLP collector). The trace of the launch must hold the HTTP
request, the outbox relay's publish, the scheduler's decision, the desired-state write, the
agent's driver action, its observed report and the timeline's writes, all under one trace id,
every span carrying the request's ID; and the context must have crossed NATS in the messages'
`traceparent` headers, KV writes included.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.conftest import Api, OpenApi, StartPlane

from einsora.api.testing import eventually
from einsora.common import telemetry

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    telemetry.install(SimpleSpanProcessor(exporter), service_name="einsora-test")
    try:
        yield exporter
    finally:
        telemetry.uninstall()


def _named(trace: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in trace if s.name == name]


async def _launch_running(
    start_plane: StartPlane, api_of: OpenApi, caller: str
) -> tuple[Api, str, str]:
    """A notebook launched in the caller's trace context, once running: (api, request id, id)."""
    plane = await start_plane(driver="sim", sim_inventory="2x l40s-48gb, 16 cpu, 64 GiB")
    api = await api_of(plane)
    async with api.http.post(
        f"{api.base}/v1/workloads",
        json={"kind": "notebook", "class": "l40s-48gb"},
        headers={"Authorization": f"Bearer {api.token}", "traceparent": caller},
    ) as resp:
        assert resp.status == 201, await resp.text()
        request_id = resp.headers["X-Request-ID"]
        workload_id = (await resp.json())["id"]
    await api.wait_state(workload_id, "running")
    return api, request_id, workload_id


async def test_one_launch_is_one_trace_from_the_request_to_the_agents_report(
    start_plane: StartPlane, api_of: OpenApi, spans: InMemorySpanExporter
) -> None:
    # The caller's own trace context: the launch joins the caller's trace.
    caller = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"
    _, request_id, workload_id = await _launch_running(start_plane, api_of, caller)

    wanted = {
        "POST /v1/workloads",
        "outbox publish intent",
        "scheduler decision",
        "desired state write",
        "agent driver start",
        "agent observed report",
        "timeline write",
    }

    def trace() -> list[ReadableSpan]:
        return [
            s
            for s in spans.get_finished_spans()
            if s.context is not None and f"{s.context.trace_id:032x}" == CALLER_TRACE
        ]

    async def complete() -> bool:
        names = {s.name for s in trace()}
        timeline = _named(trace(), "timeline write")
        events = {s.attributes.get("einsora.event") for s in timeline if s.attributes}
        return wanted <= names and "transition running" in events

    await eventually(complete, within_s=30)
    ours = trace()
    assert {s.name for s in ours} >= wanted, sorted({s.name for s in ours})
    for span in ours:
        assert span.attributes is not None
        assert span.attributes.get(telemetry.REQUEST_ID_ATTRIBUTE) == request_id, span.name

    by_id = {s.context.span_id: s for s in ours if s.context is not None}

    def parent_name(span: ReadableSpan) -> str | None:
        parent = span.parent
        return by_id[parent.span_id].name if parent and parent.span_id in by_id else None

    # The chain crossed NATS hop by hop, each hop's span the child of the one before it.
    (server,) = _named(ours, "POST /v1/workloads")
    assert server.parent is not None
    assert f"{server.parent.span_id:016x}" == "00f067aa0ba902b7"
    (publish,) = _named(ours, "outbox publish intent")
    assert parent_name(publish) == "POST /v1/workloads"
    (decision,) = _named(ours, "scheduler decision")
    assert parent_name(decision) == "outbox publish intent"
    assert decision.attributes is not None
    assert decision.attributes["einsora.workload_id"] == workload_id
    assert "desired state write" in {s.name for s in ours if parent_name(s) == "scheduler decision"}
    (start,) = _named(ours, "agent driver start")
    assert parent_name(start) == "scheduler decision"
    assert any(
        parent_name(s) == "agent driver start" for s in _named(ours, "agent observed report")
    )
    assert all(parent_name(s) == "scheduler decision" for s in _named(ours, "timeline write")), [
        parent_name(s) for s in _named(ours, "timeline write")
    ]


async def test_a_sampled_out_launch_records_nothing_and_runs(
    start_plane: StartPlane, api_of: OpenApi, spans: InMemorySpanExporter
) -> None:
    # The caller sampled this trace out: no hop makes a span of it, and the launch runs as any.
    caller = f"00-{CALLER_TRACE}-00f067aa0ba902b7-00"
    api, _, workload_id = await _launch_running(start_plane, api_of, caller)
    async with api.http.get(
        f"{api.base}/v1/workloads/{workload_id}", headers={"Authorization": f"Bearer {api.token}"}
    ) as resp:
        assert resp.status == 200
    finished = spans.get_finished_spans()
    assert not [s.name for s in finished if f"{s.context.trace_id:032x}" == CALLER_TRACE]
    # The GET had no caller context: its own trace, sampled in, with the route as its name.
    assert "GET /v1/workloads/{id}" in {s.name for s in finished}


async def test_the_gateway_and_proxy_requests_are_traced_by_the_aiohttp_instrumentation(
    start_plane: StartPlane, spans: InMemorySpanExporter
) -> None:
    plane = await start_plane(driver="sim", sim_inventory="1x l40s-48gb")
    assert plane.proxy is not None
    async with aiohttp.ClientSession() as http:
        for url, request_id in (
            (f"http://127.0.0.1:{plane.settings.gateway_port}/v1/models", "req-gateway-1"),
            (f"http://127.0.0.1:{plane.proxy.port}/", "req-proxy-1"),
        ):
            caller = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"
            headers = {"X-Request-ID": request_id, "traceparent": caller}
            async with http.get(url, headers=headers) as resp:
                assert resp.headers["X-Request-ID"] == request_id

    def server_span(request_id: str) -> ReadableSpan | None:
        for span in spans.get_finished_spans():
            attributes = span.attributes or {}
            if attributes.get(telemetry.REQUEST_ID_ATTRIBUTE) == request_id:
                return span
        return None

    for request_id in ("req-gateway-1", "req-proxy-1"):
        span = server_span(request_id)
        assert span is not None, request_id
        assert span.context is not None
        assert f"{span.context.trace_id:032x}" == CALLER_TRACE  # the caller's trace, joined
