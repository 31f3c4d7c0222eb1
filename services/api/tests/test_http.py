"""The HTTP surface: health, readiness, metrics, the generated OpenAPI document, logs."""

from __future__ import annotations

import logging

from einsora.api.openapi import openapi_document
from einsora.api.routers import all_operations
from einsora.api.testing import RunningApi
from einsora.common import logs


async def test_health_and_readiness(shared_api: RunningApi) -> None:
    health = await shared_api.client(None).get("/healthz")
    assert health.status == 200
    assert health.body == {"status": "ok"}
    ready = await shared_api.client(None).get("/readyz")
    assert ready.status == 200
    assert ready.body == {"status": "ready", "checks": {"store": "ok", "bus": "ok"}}


async def test_metrics_count_requests_by_route_template_and_status(shared_api: RunningApi) -> None:
    api = shared_api
    await api.owner.get("/v1/workloads/w-0000000000000000000a")
    await api.owner.get("/v1/nothing-here")
    text = (await api.client(None).get("/metrics")).text
    assert (
        'einsora_api_requests_total{method="GET",route="/v1/workloads/{id}",status="404"}' in text
    )
    assert 'route="<unmatched>",status="404"' in text
    assert "einsora_api_request_duration_seconds_bucket" in text
    assert "w-0000000000000000000a" not in text


async def test_openapi_is_generated_from_the_route_table(shared_api: RunningApi) -> None:
    served = await shared_api.client(None).get("/openapi.json")
    assert served.status == 200
    document = served.body
    assert document == openapi_document(all_operations())
    assert document["openapi"].startswith("3.1")
    documented = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    declared = {(op.method, op.path) for op in all_operations() if op.in_schema}
    assert documented == declared
    create = document["paths"]["/v1/workloads"]["post"]
    schema = document["components"]["schemas"]["WorkloadCreate"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/WorkloadCreate"
    )
    assert set(schema["required"]) == {"kind", "class"}
    assert {"201", "400", "401", "413", "422"} <= set(create["responses"])
    assert [p["name"] for p in create["parameters"]] == ["Idempotency-Key"]
    listing = document["paths"]["/v1/workloads"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {"limit", "cursor", "state", "kind"}


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, dict[str, str]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), logs.bound()))


async def test_every_log_line_of_a_request_has_its_request_id_tenant_and_subject(
    shared_api: RunningApi,
) -> None:
    capture = _Capture()
    logger = logging.getLogger("einsora.api")
    logger.addHandler(capture)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        answer = await shared_api.owner.get("/v1/me", headers={"X-Request-ID": "trace-me-1"})
    finally:
        logger.removeHandler(capture)
        logger.setLevel(old_level)
    mine = [(m, ctx) for m, ctx in capture.lines if ctx.get("request_id") == "trace-me-1"]
    assert mine, capture.lines
    for _, ctx in mine:
        assert ctx["tenant"] == answer.body["tenant"]["id"]
        assert ctx["subject"] == answer.body["user"]["id"]
