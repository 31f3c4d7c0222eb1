"""`/healthz` (the process answers) and `/readyz` (store and NATS reachable). `/metrics` is on
a port of its own (`metrics.metrics_app`), never on this one. Neither counts against a client
address's rate limit (`deps.context`): a probe checks no credential, and a load balancer whose
probes a flood through the same address could refuse would take a healthy api out of service."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response

from einsora.api.context import ApiContext
from einsora.api.deps import ERROR_TEXT, operation_id, reply
from einsora.api.schemas.health import HealthOut, ReadyOut

router = APIRouter(tags=["health"], generate_unique_id_function=operation_id)


@router.get("/healthz", summary="The process answers", response_model=HealthOut)
async def healthz() -> Response:
    return reply(HealthOut(status="ok"))


@router.get(
    "/readyz",
    summary="Ready: the store and NATS answer (503 otherwise)",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": ERROR_TEXT[503]}},
)
async def readyz(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    checks = {"store": "ok", "bus": "ok" if ctx.bus_connected() else "not connected"}
    try:
        await asyncio.wait_for(ctx.store.ping(), 2.0)
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        checks["store"] = f"unavailable: {exc.__class__.__name__}"
    ready = all(v == "ok" for v in checks.values())
    body = ReadyOut(status="ready" if ready else "not_ready", checks=checks)
    return reply(body, 200 if ready else 503)
