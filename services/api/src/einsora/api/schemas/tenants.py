"""Tenant, user and membership bodies."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel

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


class MemberCreate(RequestBody):
    username: Slug
    role: Role = Role.member


class MemberOut(BaseModel):
    user: UserOut
    tenant: TenantRef
    role: Role
    created_at: datetime


class MemberCreated(MemberOut):
    """A new member and their first token (its secret shown once)."""

    token: TokenCreated


class MemberPage(Page[MemberOut]):
    pass


class MeOut(BaseModel):
    """Who the token belongs to, in which tenant, with which role."""

    user: UserOut
    tenant: TenantRef
    role: Role
    operator: bool
