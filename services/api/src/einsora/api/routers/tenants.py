"""`/v1/me`, `/v1/tenants`, tenant members and invitations (ADR-0008), and offboarding a member
(issue 34, N11: `services/members.py`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from einsora.api.context import ApiContext
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
from einsora.api.projections.gateway_keys import GatewayKeysSync
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.members import CredentialsRevoked, MemberRemoved, MemberRole
from einsora.api.schemas.tenants import (
    InvitationCreate,
    InvitationCreated,
    InvitationPage,
    InvitationRedeem,
    Joined,
    MemberOut,
    MemberPage,
    MeOut,
    TenantCreate,
    TenantOut,
    TenantPage,
)
from einsora.api.services import invitations, members, tenants

router = APIRouter(tags=["tenants"], generate_unique_id_function=operation_id)
TenantId = Annotated[str, Path(alias="id")]
InvitationId = Annotated[str, Path(alias="id")]
UserRef = Annotated[str, Path(alias="user", description="the member's user id or username")]
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
    responses=errors(*BODY_ERRORS, 404, 409, 429),
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


async def _dropped(request: Request, ctx: ApiContext, done: members.Offboarded) -> None:
    """Tell every replica, and the gateway, what an offboarding revoked (after its commit)."""
    if done.forget:
        await ctx.revoked(done.forget)  # refused from the next request on, on every replica
    sync: GatewayKeysSync | None = request.app.state.ctx.gateway_keys
    if sync is not None:
        for key_id in done.gateway_keys:
            await sync.revoked(key_id)  # refused by the gateway before the answer is sent


@router.patch(
    "/v1/tenants/{id}/members/{user}",
    summary="Change a member's role (its admins, the operator); it holds on every api replica "
    "within a second, and a tenant always keeps an admin",
    response_model=MemberOut,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 403, 404, 409),
)
async def set_member_role(
    call: Me,
    tenant_id: TenantId,
    user: UserRef,
    body: Annotated[MemberRole, Depends(JsonBody(MemberRole))],
) -> Response:
    member, live = await members.set_role(call.ctx.store, call.me, tenant_id, user, body)
    if live:
        await call.ctx.revoked(live)  # forgotten everywhere: read again, with the new role
    return reply(member)


@router.delete(
    "/v1/tenants/{id}/members/{user}/credentials",
    summary="Revoke every credential a member holds in the tenant (API tokens, dashboard "
    "sessions, gateway keys, join tokens), on every replica within a second; they stay a member",
    response_model=CredentialsRevoked,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404, 503),
)
async def revoke_member_credentials(
    call: Me, request: Request, tenant_id: TenantId, user: UserRef
) -> Response:
    ctx = call.ctx
    done = await members.revoke_credentials(ctx.store, call.me, tenant_id, user, ctx.clock())
    await _dropped(request, ctx, done)
    return reply(done.answer)


@router.delete(
    "/v1/tenants/{id}/members/{user}",
    summary="Remove a member from the tenant (its admins, the operator): every credential of "
    "theirs there is revoked on every replica within a second; their workloads stay the tenant's",
    response_model=MemberRemoved,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404, 409, 503),
)
async def remove_member(call: Me, request: Request, tenant_id: TenantId, user: UserRef) -> Response:
    ctx = call.ctx
    done = await members.remove(ctx.store, call.me, tenant_id, user, ctx.clock())
    await _dropped(request, ctx, done)
    return reply(done.answer)
