"""`/v1/tenants/{id}/quota`: a tenant's quota of GPUs and GPU-hours (set by the operator), and
its use now."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
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
from einsora.api.errors import Unavailable
from einsora.api.projections.quotas import QuotasSync
from einsora.api.schemas.quotas import QuotaOut, QuotaUpdate, TenantQuotaOut
from einsora.api.services import quotas

router = APIRouter(tags=["tenants"], generate_unique_id_function=operation_id)
TenantId = Annotated[str, Path(alias="id")]


def _sync(request: Request) -> QuotasSync:
    """The service's quota sync (`service.py` sets it); an app without a bus has none."""
    sync: QuotasSync | None = request.app.state.ctx.quotas
    if sync is None:
        raise Unavailable(
            "this api has no bus, so quotas can neither reach the scheduler nor be read"
        )
    return sync


async def _answer(sync: QuotasSync, tenant_id: str, quota: QuotaOut) -> Response:
    use = quotas.use_of(await sync.usage(tenant_id))
    return reply(TenantQuotaOut(tenant_id=tenant_id, quota=quota, use=use))


@router.get(
    "/v1/tenants/{id}/quota",
    summary="A tenant's quota of GPUs and GPU-hours, and what it uses now",
    response_model=TenantQuotaOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def get_tenant_quota(call: Me, request: Request, tenant_id: TenantId) -> Response:
    found, quota = await quotas.get(call.ctx.store, call.me, tenant_id)
    return await _answer(_sync(request), found, quota)


@router.put(
    "/v1/tenants/{id}/quota",
    summary="Set a tenant's quota (the operator only); the scheduler holds to it from then on",
    response_model=TenantQuotaOut,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 404),
)
async def put_tenant_quota(
    call: Me,
    request: Request,
    tenant_id: TenantId,
    body: Annotated[QuotaUpdate, Depends(JsonBody(QuotaUpdate))],
) -> Response:
    sync = request.app.state.ctx.quotas
    found, quota = await quotas.put(
        call.ctx.store, call.me, tenant_id, body, call.ctx.catalog, call.ctx.clock()
    )
    if sync is None:
        # Stored: the first pass of a service with a bus puts it.
        raise Unavailable("the quota is stored, but this api has no bus to tell the scheduler")
    await sync.published(found)  # the scheduler reads it before the client does
    return await _answer(sync, found, quota)
