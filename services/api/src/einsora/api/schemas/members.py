"""Offboarding bodies (issue 34, N11): a member's new role, and what removing a member or
revoking their credentials revoked."""

from __future__ import annotations

from pydantic import BaseModel, Field

from einsora.api.schemas.common import RequestBody
from einsora.api.schemas.tenants import Role, TenantRef, UserOut


class MemberRole(RequestBody):
    """`PATCH /v1/tenants/{id}/members/{user}`: the member's new role."""

    role: Role


class CredentialsRevoked(BaseModel):
    """What was revoked of a member's in one tenant: refused on every api replica (and by the
    gateway) within a second."""

    user: UserOut
    tenant: TenantRef
    api_tokens: int = Field(description="API tokens revoked")
    sessions: int = Field(description="dashboard sessions ended")
    gateway_keys: int = Field(description="inference gateway keys revoked")
    join_tokens: int = Field(description="machine join tokens revoked")


class MemberRemoved(CredentialsRevoked):
    """A member removed from a tenant, with every credential of theirs there revoked. Their
    workloads, machines and usage stay the tenant's."""
