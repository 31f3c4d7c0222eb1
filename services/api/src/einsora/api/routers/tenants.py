"""`/v1/me`, `/v1/tenants`, tenant members and invitations (ADR-0008)."""

from __future__ import annotations

from einsora.api.operation import Call, Operation
from einsora.api.schemas.common import NoBody, NoQuery, PageQuery
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


async def get_me(call: Call[NoBody, NoQuery]) -> MeOut:
    return tenants.me(call.me)


async def create_tenant(call: Call[TenantCreate, NoQuery]) -> TenantOut:
    return await tenants.create_tenant(call.ctx.store, call.me, call.body)


async def list_tenants(call: Call[NoBody, PageQuery]) -> TenantPage:
    return await tenants.list_tenants(call.ctx.store, call.me, call.query)


async def invite(call: Call[InvitationCreate, NoQuery]) -> InvitationCreated:
    return await invitations.invite(call.ctx.store, call.me, call.path("id"), call.body)


async def list_tenant_invitations(call: Call[NoBody, PageQuery]) -> InvitationPage:
    return await invitations.list_for_tenant(call.ctx.store, call.me, call.path("id"), call.query)


async def revoke_invitation(call: Call[NoBody, NoQuery]) -> None:
    await invitations.revoke(call.ctx.store, call.me, call.path("id"), call.path("invitation"))


async def list_my_invitations(call: Call[NoBody, PageQuery]) -> InvitationPage:
    return await invitations.list_mine(call.ctx.store, call.me, call.query)


async def accept_invitation(call: Call[NoBody, NoQuery]) -> Joined:
    return await invitations.accept(call.ctx.store, call.me, call.path("id"))


async def redeem_invitation(call: Call[InvitationRedeem, NoQuery]) -> Joined:
    return await invitations.redeem(call.ctx.store, call.body)


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
        "/v1/tenants/{id}/invitations",
        invite,
        "Invite a user into a tenant (its admins). An existing user accepts it themself; "
        "a new user redeems the one-time code in this answer. Nobody gets a token for another.",
        "tenants",
        InvitationCreated,
        status=201,
        body=InvitationCreate,
        errors=(403, 404, 409),
    ),
    Operation(
        "GET",
        "/v1/tenants/{id}/invitations",
        list_tenant_invitations,
        "List a tenant's invitations (its admins; codes are never shown again)",
        "tenants",
        InvitationPage,
        query=PageQuery,
        errors=(403, 404),
    ),
    Operation(
        "DELETE",
        "/v1/tenants/{id}/invitations/{invitation}",
        revoke_invitation,
        "Revoke an open invitation (its tenant's admins)",
        "tenants",
        status=204,
        errors=(403, 404),
    ),
    Operation(
        "GET",
        "/v1/invitations",
        list_my_invitations,
        "List the open invitations addressed to you",
        "tenants",
        InvitationPage,
        query=PageQuery,
    ),
    Operation(
        "POST",
        "/v1/invitations/{id}/accept",
        accept_invitation,
        "Accept an invitation addressed to you: you join its tenant, with a token of your own "
        "for it (shown once)",
        "tenants",
        Joined,
        status=201,
        errors=(404, 409),
    ),
    Operation(
        "POST",
        "/v1/invitations/redeem",
        redeem_invitation,
        "A new user redeems their one-time invitation code: the user is made, with their first "
        "token (shown once). No API token needed.",
        "tenants",
        Joined,
        status=201,
        body=InvitationRedeem,
        auth=False,
        errors=(404, 409),
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
