"""Tenant, user, membership and invitation bodies."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from einsora.api.schemas.common import Page, RequestBody, Slug
from einsora.api.schemas.tokens import TokenCreated


class Role(StrEnum):
    """A member's role in a tenant: admins add members."""

    admin = "admin"
    member = "member"


class UserOut(BaseModel):
    id: str
    username: str


class TenantRef(BaseModel):
    id: str
    name: str


class TenantCreate(RequestBody):
    name: Slug


class TenantOut(BaseModel):
    id: str
    name: str
    created_at: datetime


class TenantPage(Page[TenantOut]):
    pass


class MemberOut(BaseModel):
    user: UserOut
    tenant: TenantRef
    role: Role
    created_at: datetime


class MemberPage(Page[MemberOut]):
    pass


class MeOut(BaseModel):
    """Who the token belongs to, in which tenant, with which role."""

    user: UserOut
    tenant: TenantRef
    role: Role
    operator: bool


INVITATION_CODE_PATTERN = r"^inv_[A-Za-z0-9_-]{20,100}$"


class InvitationCreate(RequestBody):
    """Invite a user, by username, into a tenant with a role."""

    username: Slug
    role: Role = Role.member
    expires_in_days: int = Field(default=7, ge=1, le=90)


class InvitationOut(BaseModel):
    """An invitation. `existing_user`: the invitee accepts it signed in as themself; otherwise
    the one-time `code` (shown only when the invitation is made) makes the new user."""

    id: str
    tenant: TenantRef
    username: str
    role: Role
    existing_user: bool
    created_at: datetime
    expires_at: datetime
    accepted_at: datetime | None
    revoked_at: datetime | None


class InvitationCreated(InvitationOut):
    """A new invitation; for a new user, the code they open (shown once)."""

    code: str | None = Field(
        description="for a new user: the one-time code `inv_…` they redeem at "
        "POST /v1/invitations/redeem (shown now and never again); null for an existing user, "
        "who accepts at POST /v1/invitations/{id}/accept with their own token"
    )


class InvitationPage(Page[InvitationOut]):
    pass


class InvitationRedeem(RequestBody):
    """A new user opens their invitation: the code, once, for their first token."""

    code: str = Field(pattern=INVITATION_CODE_PATTERN)


class Joined(BaseModel):
    """A membership just begun, with the caller's own first token in that tenant (shown once)."""

    user: UserOut
    tenant: TenantRef
    role: Role
    token: TokenCreated
