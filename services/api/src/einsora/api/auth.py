"""API tokens: `tsk_…` secrets, stored only as their SHA-256, checked on every request.

A secret has 256 random bits, so a plain SHA-256 (not a slow password hash) is enough, and it
lets a lookup be one indexed query. Every check reads the store, so a revoked or expired token
is refused at once, on every replica.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.errors import Unauthenticated
from einsora.api.store import Store
from einsora.common.schemas import utcnow

TOKEN_PREFIX = "tsk_"  # noqa: S105 (a prefix, not a secret)
_BEARER_RE = re.compile(r"^Bearer (tsk_[A-Za-z0-9_-]{20,100})$")
LAST_USED_RESOLUTION = timedelta(seconds=60)
"""`last_used_at` is written at most this often per token: a GET should not be a write."""


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a user, in the one tenant their token belongs to.

    `is_operator` needs both an operator user and a token minted with operator rights
    (ADR-0008): membership of a tenant never confers them.
    """

    token_id: str
    user_id: str
    username: str
    tenant_id: str
    tenant_name: str
    role: str
    is_operator: bool

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


_LOOKUP = (
    sa.select(
        m.api_tokens.c.id,
        m.api_tokens.c.expires_at,
        m.api_tokens.c.revoked_at,
        m.api_tokens.c.last_used_at,
        m.api_tokens.c.operator.label("token_operator"),
        m.users.c.id.label("user_id"),
        m.users.c.username,
        m.users.c.is_operator,
        m.tenants.c.id.label("tenant_id"),
        m.tenants.c.name.label("tenant_name"),
        m.members.c.role,
    )
    .select_from(m.api_tokens)
    .join(m.users, m.users.c.id == m.api_tokens.c.user_id)
    .join(m.tenants, m.tenants.c.id == m.api_tokens.c.tenant_id)
    .join(
        m.members,
        sa.and_(
            m.members.c.tenant_id == m.api_tokens.c.tenant_id,
            m.members.c.user_id == m.api_tokens.c.user_id,
        ),
    )
    .where(m.api_tokens.c.secret_sha256 == sa.bindparam("digest"))
)


async def authenticate(store: Store, authorization: str | None) -> Principal:
    """The principal of an `Authorization: Bearer tsk_…` header, or Unauthenticated."""
    if not authorization:
        raise Unauthenticated("missing API token: send `Authorization: Bearer tsk_…`")
    match = _BEARER_RE.match(authorization)
    if match is None:
        raise Unauthenticated("malformed Authorization header: expected `Bearer tsk_…`")
    async with store.read() as conn:
        row = (await conn.execute(_LOOKUP, {"digest": secret_hash(match[1])})).first()
    if row is None:
        raise Unauthenticated("unknown API token")
    now = utcnow()
    if row.revoked_at is not None:
        raise Unauthenticated("this API token was revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthenticated(f"this API token expired at {row.expires_at.isoformat()}")
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        await _touch(store, row.id, now)
    return Principal(
        token_id=row.id,
        user_id=row.user_id,
        username=row.username,
        tenant_id=row.tenant_id,
        tenant_name=row.tenant_name,
        role=row.role,
        is_operator=bool(row.is_operator) and bool(row.token_operator),
    )


async def _touch(store: Store, token_id: str, now: datetime) -> None:
    async with store.write() as conn:
        await conn.execute(
            sa.update(m.api_tokens).where(m.api_tokens.c.id == token_id).values(last_used_at=now)
        )
