"""Dashboard session bodies: signing in (a password, a one-time link, an invitation), the
session as the dashboard sees it, sign-in links, and a user's password."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, Field

from einsora.api.passwords import MAX_LENGTH, MIN_LENGTH
from einsora.api.schemas.common import RequestBody, Slug
from einsora.api.schemas.tenants import INVITATION_CODE_PATTERN, Role, TenantRef, UserOut

SIGN_IN_CODE_PATTERN = r"^sil_[A-Za-z0-9_-]{43}$"

Password = Annotated[
    str,
    Field(
        min_length=MIN_LENGTH,
        max_length=MAX_LENGTH,
        description=f"at least {MIN_LENGTH} characters; a passphrase of a few words is best",
    ),
]


class SessionMethod(StrEnum):
    """How a session began."""

    link = "link"
    password = "password"  # noqa: S105 (a name, not a secret)
    invitation = "invitation"


class PasswordSignIn(RequestBody):
    """`POST /v1/sessions`: sign in with a username and password."""

    username: Slug
    password: str = Field(min_length=1, max_length=MAX_LENGTH)
    tenant: Slug | None = Field(
        default=None,
        description="the tenant to act in, by name; leave it out for the first you joined",
    )


class LinkSignIn(RequestBody):
    """`POST /v1/sessions/link`: exchange a one-time sign-in link's code for a session."""

    code: str = Field(pattern=SIGN_IN_CODE_PATTERN)


class InvitationSignUp(RequestBody):
    """`POST /v1/sessions/invitation`: a new user opens their invitation link and chooses a
    password; the user, the membership and a session are made at once."""

    code: str = Field(pattern=INVITATION_CODE_PATTERN)
    password: Password


class SessionOut(BaseModel):
    """The session a dashboard runs in: who, in which tenant, and what its script needs."""

    id: str
    user: UserOut
    tenant: TenantRef
    role: Role
    operator: bool
    method: SessionMethod | None = Field(
        default=None, description="how it began (null when not known to this answer)"
    )
    csrf_token: str = Field(
        description="send it as `X-CSRF-Token` with every POST, PUT, PATCH and DELETE"
    )
    expires_at: datetime = Field(description="when it ends at the latest, used or not")
    idle_timeout_s: float = Field(description="it ends after this many seconds unused")
    has_password: bool
    gateway_url: str = Field(description="the inference gateway's OpenAI base URL")


class SignInLinkCreate(RequestBody):
    """`POST /v1/sign-in-links`: a one-time link that signs its opener in as the caller."""

    expires_in_minutes: int = Field(default=15, ge=1, le=24 * 60)


class SignInLinkCreated(BaseModel):
    """A one-time sign-in link: `path` on the dashboard's origin (the code rides in the
    fragment, so it never reaches a server log or a Referer)."""

    id: str
    code: str = Field(description="`sil_…`: shown now and never again")
    path: str = Field(examples=["/sign-in#link=sil_…"])
    expires_at: datetime


class PasswordChange(RequestBody):
    """`PUT /v1/me/password`: set or change the caller's own password."""

    current_password: str | None = Field(
        default=None,
        max_length=MAX_LENGTH,
        description="required when a password is set already",
    )
    password: Password
