"""The HTTP surface: health, readiness, metrics, the generated OpenAPI document, logs."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.types import Receive, Scope, Send

from einsora.api.app import openapi_document
from einsora.api.deps import AUTH_ERRORS, AUTHENTICATED, BODY_ERRORS, JsonBody
from einsora.api.errors import ApiError, NotFound, api_error_of
from einsora.api.metrics import ApiMetrics
from einsora.api.middleware import EdgeMiddleware
from einsora.api.routers import ROUTERS
from einsora.api.testing import RunningApi, running_api
from einsora.common import logs
from einsora.common.errors import BusUnavailable, ConfigError
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


def _routes() -> list[APIRoute]:
    return [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]


async def test_openapi_is_generated_from_the_route_table(shared_api: RunningApi) -> None:
    served = await shared_api.client(None).get("/openapi.json")
    assert served.status == 200
    document = served.body
    assert document == openapi_document()
    assert document["openapi"].startswith("3.1")
    documented = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    declared = {
        (m, r.path_format) for r in _routes() if r.include_in_schema for m in r.methods or ()
    }
    assert documented == declared
    create = document["paths"]["/v1/workloads"]["post"]
    schema = document["components"]["schemas"]["WorkloadCreate"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/WorkloadCreate"
    )
    assert set(schema["required"]) == {"kind", "class"}
    assert {"201", "400", "401", "413", "422"} <= set(create["responses"])
    assert [p["name"] for p in create["parameters"]] == ["Idempotency-Key", "traceparent"]
    listing = document["paths"]["/v1/workloads"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {"limit", "cursor", "state", "kind"}
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer"}
    # The dashboard's session cookie is the other way in (ADR-0019).
    assert {k: schemes["session"][k] for k in ("type", "in", "name")} == {
        "type": "apiKey",
        "in": "cookie",
        "name": "einsora_session",
    }
    assert listing["security"] == [{"bearer": []}, {"session": []}]


def _calls(route: APIRoute) -> set[object]:
    found: set[object] = set()
    todo = list(route.dependant.dependencies)
    while todo:
        dependency = todo.pop()
        found.add(dependency.call)
        todo.extend(dependency.dependencies)
    return found


def test_every_operation_documents_what_its_dependencies_answer() -> None:
    """An authenticated route documents the bearer scheme and 401/429/503; a route with a body
    its model and 400/413/422; a route with parameters 422; every error is an ErrorBody."""
    document = openapi_document()
    for route in _routes():
        if not route.include_in_schema:
            continue
        calls = _calls(route)
        for method in route.methods or ():
            operation = document["paths"][route.path_format][method.lower()]
            statuses = {int(s) for s in operation["responses"]}
            where = (method, route.path_format)
            authenticated = bool(calls & set(AUTHENTICATED))
            assert ("security" in operation) == authenticated, where
            if authenticated:
                assert set(AUTH_ERRORS) <= statuses, where
            bodies = [c.model for c in calls if isinstance(c, JsonBody)]
            assert ("requestBody" in operation) == bool(bodies), where
            if bodies:
                assert set(BODY_ERRORS) <= statuses, where
                ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith(f"/{bodies[0].__name__}"), where
            if operation.get("parameters"):
                assert 422 in statuses, where
            for status, answer in operation["responses"].items():
                if int(status) >= 400 and route.path != "/readyz":
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, where


async def test_head_answers_wherever_get_does_and_no_docs_ui(shared_api: RunningApi) -> None:
    head = await shared_api.owner.call("HEAD", "/v1/me")
    assert head.status == 200
    assert head.text == ""
    assert head.headers["X-Request-ID"]
    assert (await shared_api.owner.call("HEAD", "/v1/workloads")).status == 200
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        answer = await shared_api.client(None).get(path)
        assert answer.status == 404, path
        assert answer.body["error"] == "not_found"


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


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (NotFound("no workload"), 404, "not_found"),
        (IntegrityError("INSERT", {}, Exception("UNIQUE")), 409, "conflict"),
        (DataError("INSERT", {}, Exception("too long")), 422, "validation_error"),
        (OperationalError("SELECT", {}, Exception("locked")), 503, "unavailable"),
        (BusUnavailable("NATS went away"), 503, "unavailable"),
        (ConfigError("a bug, not the caller's"), 500, "internal"),
        (RuntimeError("a bug"), 500, "internal"),
    ],
    ids=["api", "integrity", "data", "store", "retryable", "einsora", "other"],
)
def test_what_each_failure_answers(failure: Exception, status: int, code: str) -> None:
    error = api_error_of(failure)
    assert isinstance(error, ApiError)
    assert (error.status, error.code) == (status, code)
    if status == 500:
        assert "request ID" in error.message  # and nothing of the failure itself


async def test_the_edge_answers_a_failure_nothing_handled_with_its_request_id() -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug")

    edge = EdgeMiddleware(broken, metrics=ApiMetrics())
    transport = httpx.ASGITransport(app=edge)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        answer = await client.get("/v1/me", headers={"X-Request-ID": "trace-me-2"})
    assert answer.status_code == 500
    assert answer.headers["X-Request-ID"] == "trace-me-2"
    assert answer.json() == {
        "error": "internal",
        "message": "internal error; quote the request ID",
        "request_id": "trace-me-2",
        "details": [],
    }
