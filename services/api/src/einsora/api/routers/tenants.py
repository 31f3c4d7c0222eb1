"""`/v1/me`, `/v1/tenants`, tenant members and invitations (ADR-0008)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from starlette.responses import Response

from einsora.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    PARAM_ERRORS,
    Ctx,
    JsonBody,
    Me,
    errors,
    no_content,
    operation_id,
    reply,
)
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.tenants import (
    InvitationCreate,
    InvitationCreated,
    InvitationPage,
    InvitationRedeem,
    Joined,
    MemberPage,
    MeOut,
    TenantCreate,
    TenantOut,
    TenantPage,
)
from einsora.api.services import invitations, tenants

router = APIRouter(tags=["tenants"], generate_unique_id_function=operation_id)
TenantId = Annotated[str, Path(alias="id")]
InvitationId = Annotated[str, Path(alias="id")]
Page = Annotated[PageQuery, Query()]


@router.get(
    "/v1/me",
    summary="Who this token is: user, tenant, role",
    response_model=MeOut,
    responses=errors(*AUTH_ERRORS),
)
async def get_me(call: Me) -> Response:
    return reply(tenants.me(call.me))


@router.post(
    "/v1/tenants",
    summary="Create a tenant (the operator only)",
    response_model=TenantOut,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 409),
)
async def create_tenant(
    call: Me, body: Annotated[TenantCreate, Depends(JsonBody(TenantCreate))]
) -> Response:
    return reply(await tenants.create_tenant(call.ctx.store, call.me, body), 201)


@router.get(
    "/v1/tenants",
    summary="List tenants (the operator sees all; anyone else their own)",
    response_model=TenantPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_tenants(call: Me, query: Page) -> Response:
    return reply(await tenants.list_tenants(call.ctx.store, call.me, query))


@router.post(
    "/v1/tenants/{id}/invitations",
    summary="Invite a user into a tenant (its admins). An existing user accepts it themself; "
    "a new user redeems the one-time code in this answer. Nobody gets a token for another.",
    response_model=InvitationCreated,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 404, 409),
)
async def invite(
    call: Me,
    tenant_id: TenantId,
    body: Annotated[InvitationCreate, Depends(JsonBody(InvitationCreate))],
) -> Response:
    return reply(await invitations.invite(call.ctx.store, call.me, tenant_id, body), 201)


@router.get(
    "/v1/tenants/{id}/invitations",
    summary="List a tenant's invitations (its admins; codes are never shown again)",
    response_model=InvitationPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404),
)
async def list_tenant_invitations(call: Me, tenant_id: TenantId, query: Page) -> Response:
    return reply(await invitations.list_for_tenant(call.ctx.store, call.me, tenant_id, query))


@router.delete(
    "/v1/tenants/{id}/invitations/{invitation}",
    summary="Revoke an open invitation (its tenant's admins)",
    status_code=204,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404),
)
async def revoke_invitation(
    call: Me, tenant_id: TenantId, invitation: Annotated[str, Path()]
) -> Response:
    await invitations.revoke(call.ctx.store, call.me, tenant_id, invitation)
    return no_content()


@router.get(
    "/v1/invitations",
    summary="List the open invitations addressed to you",
    response_model=InvitationPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_my_invitations(call: Me, query: Page) -> Response:
    return reply(await invitations.list_mine(call.ctx.store, call.me, query))


@router.post(
    "/v1/invitations/{id}/accept",
    summary="Accept an invitation addressed to you: you join its tenant, with a token of your "
    "own for it (shown once)",
    response_model=Joined,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404, 409),
)
async def accept_invitation(call: Me, invitation_id: InvitationId) -> Response:
    return reply(await invitations.accept(call.ctx.store, call.me, invitation_id), 201)


@router.post(
    "/v1/invitations/redeem",
    summary="A new user redeems their one-time invitation code: the user is made, with their "
    "first token (shown once). No API token needed.",
    response_model=Joined,
    status_code=201,
    responses=errors(*BODY_ERRORS, 404, 409),
)
async def redeem_invitation(
    ctx: Ctx, body: Annotated[InvitationRedeem, Depends(JsonBody(InvitationRedeem))]
) -> Response:
    return reply(await invitations.redeem(ctx.store, body), 201)


@router.get(
    "/v1/tenants/{id}/members",
    summary="List a tenant's members",
    response_model=MemberPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def list_members(call: Me, tenant_id: TenantId, query: Page) -> Response:
    return reply(await tenants.list_members(call.ctx.store, call.me, tenant_id, query))
