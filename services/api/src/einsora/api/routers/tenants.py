"""`/v1/me`, `/v1/tenants` and tenant members."""

from __future__ import annotations

from einsora.api.operation import Call, Operation
from einsora.api.schemas.common import NoBody, NoQuery, PageQuery
from einsora.api.schemas.tenants import (
    MemberCreate,
    MemberCreated,
    MemberPage,
    MeOut,
    TenantCreate,
    TenantOut,
    TenantPage,
)
from einsora.api.services import tenants


async def get_me(call: Call[NoBody, NoQuery]) -> MeOut:
    return tenants.me(call.me)


async def create_tenant(call: Call[TenantCreate, NoQuery]) -> TenantOut:
    return await tenants.create_tenant(call.ctx.store, call.me, call.body)


async def list_tenants(call: Call[NoBody, PageQuery]) -> TenantPage:
    return await tenants.list_tenants(call.ctx.store, call.me, call.query)


async def add_member(call: Call[MemberCreate, NoQuery]) -> MemberCreated:
    return await tenants.add_member(call.ctx.store, call.me, call.path("id"), call.body)


async def list_members(call: Call[NoBody, PageQuery]) -> MemberPage:
    return await tenants.list_members(call.ctx.store, call.me, call.path("id"), call.query)


OPERATIONS = [
    Operation("GET", "/v1/me", get_me, "Who this token is: user, tenant, role", "tenants", MeOut),
    Operation(
        "POST",
        "/v1/tenants",
        create_tenant,
        "Create a tenant (the operator only)",
        "tenants",
        TenantOut,
        status=201,
        body=TenantCreate,
        errors=(403, 409),
    ),
    Operation(
        "GET",
        "/v1/tenants",
        list_tenants,
        "List tenants (the operator sees all; anyone else their own)",
        "tenants",
        TenantPage,
        query=PageQuery,
    ),
    Operation(
        "POST",
        "/v1/tenants/{id}/members",
        add_member,
        "Add a member to a tenant (its admins); answers with their first token, shown once",
        "tenants",
        MemberCreated,
        status=201,
        body=MemberCreate,
        errors=(403, 404, 409),
    ),
    Operation(
        "GET",
        "/v1/tenants/{id}/members",
        list_members,
        "List a tenant's members",
        "tenants",
        MemberPage,
        query=PageQuery,
        errors=(404,),
    ),
]
