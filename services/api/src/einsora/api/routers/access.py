"""`/v1/workloads/{id}/access`: a one-time link that opens a running workload in the browser."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from einsora.api.deps import (
    AUTH_ERRORS,
    PARAM_ERRORS,
    Me,
    errors,
    operation_id,
    reply,
)
from einsora.api.routers.workloads import WorkloadId
from einsora.api.schemas.access import AccessOut
from einsora.api.services import access

router = APIRouter(tags=["workloads"], generate_unique_id_function=operation_id)


@router.post(
    "/v1/workloads/{id}/access",
    summary="A one-time link (valid 60 s) to a running workload's own site, for the browser",
    response_model=AccessOut,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404, 409),
)
async def create_access(call: Me, workload_id: WorkloadId) -> Response:
    ctx = call.ctx
    out = await access.mint(
        ctx.store, ctx.settings, call.me, workload_id, request_id=call.request_id, clock=ctx.clock
    )
    # The link is a credential for 60 s: never cache it, never leak it onward.
    return reply(out, 201, {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})
