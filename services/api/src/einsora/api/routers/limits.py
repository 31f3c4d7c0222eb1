"""`/v1/tenants/{id}/limits`: a tenant's cap on workloads (set by the operator) and rate limits."""

from __future__ import annotations

from einsora.api.operation import Call, Operation
from einsora.api.schemas.common import NoBody, NoQuery
from einsora.api.schemas.limits import TenantLimitsOut, TenantLimitsUpdate
from einsora.api.services import limits


async def get_tenant_limits(call: Call[NoBody, NoQuery]) -> TenantLimitsOut:
    return await limits.get(call.ctx.store, call.me, call.path("id"), call.ctx.settings)


async def put_tenant_limits(call: Call[TenantLimitsUpdate, NoQuery]) -> TenantLimitsOut:
    return await limits.put(call.ctx.store, call.me, call.path("id"), call.body, call.ctx.settings)


OPERATIONS = [
    Operation(
        "GET",
        "/v1/tenants/{id}/limits",
        get_tenant_limits,
        "A tenant's limits: its cap on workloads, its tokens' rate limits, and its usage now",
        "tenants",
        TenantLimitsOut,
        errors=(404,),
    ),
    Operation(
        "PUT",
        "/v1/tenants/{id}/limits",
        put_tenant_limits,
        "Set a tenant's cap on workloads that are not removed (the operator only)",
        "tenants",
        TenantLimitsOut,
        body=TenantLimitsUpdate,
        errors=(403, 404),
    ),
]
