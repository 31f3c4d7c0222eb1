"""The HTTP surface: health, readiness, metrics, the generated OpenAPI document, logs."""

from __future__ import annotations

import logging
from pathlib import Path

from einsora.api.openapi import openapi_document
from einsora.api.routers import all_operations
from einsora.api.testing import RunningApi, running_api
from einsora.common import logs
from einsora.common.settings import Settings
from einsora.common.testing import Bus


async def test_health_and_readiness(shared_api: RunningApi) -> None:
    health = await shared_api.client(None).get("/healthz")
    assert health.status == 200
    assert health.body == {"status": "ok"}
    ready = await shared_api.client(None).get("/readyz")
    assert ready.status == 200
    assert ready.body == {"status": "ready", "checks": {"store": "ok", "bus": "ok"}}


async def test_metrics_count_requests_by_route_template_and_status_on_their_own_port(
    bus: Bus, sqlite_url: str, data_dir: Path
) -> None:
    settings = Settings(
        nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir, api_metrics_port=0
    )
    async with running_api(settings) as api:
        await api.owner.get("/v1/workloads/w-0000000000000000000a")
        await api.owner.get("/v1/nothing-here")
        on_api_port = await api.client(None).get("/metrics")
        assert api.service.metrics_port is not None
        metrics = f"http://127.0.0.1:{api.service.metrics_port}"
        async with api.session.get(metrics + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        async with api.session.get(metrics + "/v1/me") as resp:
            assert resp.status == 404
    assert on_api_port.status == 404
    assert on_api_port.body["error"] == "not_found"
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
