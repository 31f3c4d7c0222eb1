"""`/healthz` (the process answers), `/readyz` (store and NATS reachable), `/metrics`."""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response

from einsora.api.operation import Call, Operation
from einsora.api.schemas.common import NoBody, NoQuery
from einsora.api.schemas.health import HealthOut, ReadyOut


async def healthz(call: Call[NoBody, NoQuery]) -> HealthOut:
    return HealthOut(status="ok")


async def readyz(call: Call[NoBody, NoQuery]) -> Response:
    checks = {"store": "ok", "bus": "ok" if call.ctx.bus_connected() else "not connected"}
    try:
        await asyncio.wait_for(call.ctx.store.ping(), 2.0)
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        checks["store"] = f"unavailable: {exc.__class__.__name__}"
    ready = all(v == "ok" for v in checks.values())
    body = ReadyOut(status="ready" if ready else "not_ready", checks=checks)
    return Response(
        body.model_dump_json(), status_code=200 if ready else 503, media_type="application/json"
    )


async def metrics(call: Call[NoBody, NoQuery]) -> Response:
    return Response(call.ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)


OPERATIONS = [
    Operation("GET", "/healthz", healthz, "The process answers", "health", HealthOut, auth=False),
    Operation(
        "GET",
        "/readyz",
        readyz,
        "Ready: the store and NATS answer (503 otherwise)",
        "health",
        ReadyOut,
        auth=False,
        extra_responses={503: ReadyOut},
    ),
    Operation(
        "GET", "/metrics", metrics, "Prometheus metrics", "health", auth=False, in_schema=False
    ),
]
