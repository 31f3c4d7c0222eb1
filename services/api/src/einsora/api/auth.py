"""API tokens: `tsk_…` secrets, stored only as their SHA-256, checked on every request.

A secret has 256 random bits, so a plain SHA-256 (not a slow password hash) is enough, and it
lets a lookup be one indexed query. A verified token is remembered in the process
(`VerifiedTokens`), so most requests need no query at all: a revocation drops it here before the
DELETE answers and on every other replica as soon as the bus tells it
(`consumers/revocations.py`); expiry is checked on every request; and an entry older than
`VerifiedTokens.ttl_s` is read again, the backstop for a change the bus did not carry (a replica
that was disconnected forgets everything when it reconnects).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

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


def lookup_by_digest(credentials: sa.Table, *own: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """The caller behind a credential row (an API token, a dashboard session) found by its
    secret's digest: the row's `own` columns, its user, and that user's membership in the
    credential's tenant (no row when the membership is gone)."""
    return (
        sa.select(
            *own,
            m.users.c.id.label("user_id"),
            m.users.c.username,
            m.users.c.is_operator,
            m.tenants.c.id.label("tenant_id"),
            m.tenants.c.name.label("tenant_name"),
            m.members.c.role,
        )
        .select_from(credentials)
        .join(m.users, m.users.c.id == credentials.c.user_id)
        .join(m.tenants, m.tenants.c.id == credentials.c.tenant_id)
        .join(
            m.members,
            sa.and_(
                m.members.c.tenant_id == credentials.c.tenant_id,
                m.members.c.user_id == credentials.c.user_id,
            ),
        )
        .where(credentials.c.secret_sha256 == sa.bindparam("digest"))
    )


_LOOKUP = lookup_by_digest(
    m.api_tokens,
    m.api_tokens.c.id,
    m.api_tokens.c.expires_at,
    m.api_tokens.c.revoked_at,
    m.api_tokens.c.last_used_at,
    m.api_tokens.c.operator.label("token_operator"),
)


@dataclass(frozen=True)
class Verified:
    """A credential found valid (an API token, or a dashboard session: `session_auth.py`), as
    `VerifiedTokens` remembers it by the SHA-256 of its secret."""

    principal: Principal
    expires_at: datetime | None
    last_used_at: datetime | None
    read_at: float
    """`time.monotonic()` when the lookup that found it began."""


class VerifiedTokens:
    """Tokens this process verified lately, by the SHA-256 of their secret.

    A lookup that began before a revocation may finish after it; `remember` refuses what such a
    lookup found, so a revoked token can never come back into the cache.
    """

    def __init__(self, ttl_s: float = 30.0, max_entries: int = 50_000) -> None:
        self.ttl_s = ttl_s
        self._max = max_entries
        self._by_digest: dict[str, Verified] = {}
        self._revoked_at: dict[str, float] = {}
        """Token id → when it was revoked, kept for ttl_s (longer than any lookup in flight)."""
        self.hits = 0
        self.misses = 0

    def get(self, digest: str) -> Verified | None:
        found = self._by_digest.get(digest)
        if found is None:
            self.misses += 1
            return None
        if time.monotonic() - found.read_at >= self.ttl_s:
            del self._by_digest[digest]
            self.misses += 1
            return None
        self.hits += 1
        return found

    def remember(self, digest: str, verified: Verified) -> None:
        revoked = self._revoked_at.get(verified.principal.token_id)
        if revoked is not None and revoked >= verified.read_at:
            return  # revoked while it was being looked up
        if len(self._by_digest) >= self._max:
            self._by_digest.clear()  # a flood of distinct tokens: start again rather than grow
        self._by_digest[digest] = verified

    def forget(self, token_ids: Sequence[str]) -> None:
        """Drop these tokens at once (they were revoked)."""
        now = time.monotonic()
        doomed = set(token_ids)
        for token_id in doomed:
            self._revoked_at[token_id] = now
        for digest, verified in list(self._by_digest.items()):
            if verified.principal.token_id in doomed:
                del self._by_digest[digest]
        if len(self._revoked_at) > 10_000:
            cutoff = now - self.ttl_s
            self._revoked_at = {t: at for t, at in self._revoked_at.items() if at > cutoff}

    def clear(self) -> None:
        """Forget everything (after missing the bus a while: a revocation may have been missed)."""
        now = time.monotonic()
        for verified in self._by_digest.values():
            self._revoked_at.setdefault(verified.principal.token_id, now)
        self._by_digest.clear()


async def authenticate(
    store: Store,
    authorization: str | None,
    cache: VerifiedTokens,
    *,
    now: datetime | None = None,
) -> Principal:
    """The principal of an `Authorization: Bearer tsk_…` header, or Unauthenticated. `now`
    (default: the wall clock) is when the request came, for the token's expiry."""
    if not authorization:
        raise Unauthenticated("missing API token: send `Authorization: Bearer tsk_…`")
    match = _BEARER_RE.match(authorization)
    if match is None:
        raise Unauthenticated("malformed Authorization header: expected `Bearer tsk_…`")
    digest = secret_hash(match[1])
    verified = cache.get(digest)
    if verified is None:
        verified = await _look_up(store, digest)
        cache.remember(digest, verified)
    now = now or utcnow()
    if verified.expires_at is not None and verified.expires_at <= now:
        raise Unauthenticated(f"this API token expired at {verified.expires_at.isoformat()}")
    if verified.last_used_at is None or now - verified.last_used_at >= LAST_USED_RESOLUTION:
        await _touch(store, verified.principal.token_id, now)
        cache.remember(digest, replace(verified, last_used_at=now))
    return verified.principal


async def _look_up(store: Store, digest: str) -> Verified:
    """The token with this digest from the store, or Unauthenticated saying why not."""
    read_at = time.monotonic()
    row: Any = await store.query(lambda conn: conn.execute(_LOOKUP, {"digest": digest}).first())
    if row is None:
        raise Unauthenticated("unknown API token")
    if row.revoked_at is not None:
        raise Unauthenticated("this API token was revoked")
    principal = Principal(
        token_id=row.id,
        user_id=row.user_id,
        username=row.username,
        tenant_id=row.tenant_id,
        tenant_name=row.tenant_name,
        role=row.role,
        is_operator=bool(row.is_operator) and bool(row.token_operator),
    )
    return Verified(principal, row.expires_at, row.last_used_at, read_at)


async def _touch(store: Store, token_id: str, now: datetime) -> None:
    touch = sa.update(m.api_tokens).where(m.api_tokens.c.id == token_id).values(last_used_at=now)
    await store.run(lambda conn: conn.execute(touch))
