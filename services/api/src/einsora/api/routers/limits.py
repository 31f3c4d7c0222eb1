"""`/v1/tenants/{id}/limits`: a tenant's cap on workloads (set by the operator) and rate limits."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from starlette.responses import Response

from einsora.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    PARAM_ERRORS,
    JsonBody,
    Me,
    errors,
    operation_id,
    reply,
)
from einsora.api.schemas.limits import TenantLimitsOut, TenantLimitsUpdate
from einsora.api.services import limits

router = APIRouter(tags=["tenants"], generate_unique_id_function=operation_id)
TenantId = Annotated[str, Path(alias="id")]


@router.get(
    "/v1/tenants/{id}/limits",
    summary="A tenant's limits: its cap on workloads, its tokens' rate limits, and its usage now",
    response_model=TenantLimitsOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def get_tenant_limits(call: Me, tenant_id: TenantId) -> Response:
    return reply(await limits.get(call.ctx.store, call.me, tenant_id, call.ctx.settings))


@router.put(
    "/v1/tenants/{id}/limits",
    summary="Set a tenant's cap on workloads that are not removed (the operator only)",
    response_model=TenantLimitsOut,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 404),
)
async def put_tenant_limits(
    call: Me,
    tenant_id: TenantId,
    body: Annotated[TenantLimitsUpdate, Depends(JsonBody(TenantLimitsUpdate))],
) -> Response:
    return reply(await limits.put(call.ctx.store, call.me, tenant_id, body, call.ctx.settings))
