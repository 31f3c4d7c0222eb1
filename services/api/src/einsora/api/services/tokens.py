"""API tokens: issue (the secret returned once, its hash stored), list, revoke.

A token belongs to one user in one tenant, and is only ever minted for the caller themself (or
for a new user redeeming their invitation: ADR-0008). A user sees and revokes only their own
tokens, and anyone else's token id answers 404. Operator rights are the token's own: only an
operator token may mint another one that carries them.

A credential passes on no more than it has (issue 34, N12): a token never outlives the
credential that made it (`expiry_bound`: an expiring token's expiry, inherited through sign-in
links and their sessions; a session's own tokens at most `SESSION_TOKEN_MAX_DAYS`), and a user
holds at most `api_tokens_per_user` live tokens, counted under a lock on the user's row so that
concurrent requests cannot both take the last place.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal, new_secret, secret_hash
from einsora.api.errors import Conflict, Forbidden, NotFound, field_error
from einsora.api.pagination import keyset_page
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.tokens import TokenCreate, TokenCreated, TokenOut, TokenPage
from einsora.api.store import Store, activity_target
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import utcnow

SESSION_TOKEN_MAX_DAYS = 90
"""A token made from a dashboard session expires within this many days. A session is a person
at a browser for a few days at most; the token it makes for their scripts should not keep its
access for ever when the browser's cookie is stolen, and 90 days (the activity log's retention)
is long enough for a script that someone looks after."""


async def issue(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    user_id: str,
    name: str,
    expires_at: datetime | None = None,
    operator: bool = False,
    now: datetime | None = None,
) -> TokenCreated:
    """A new token for `user_id` in `tenant_id`, inside the caller's transaction."""
    now = now or utcnow()
    secret = new_secret()
    token_id = new_id("token")
    await conn.execute(
        sa.insert(m.api_tokens).values(
            id=token_id,
            tenant_id=tenant_id,
            user_id=user_id,
            name=name,
            secret_sha256=secret_hash(secret),
            created_at=now,
            expires_at=expires_at,
            operator=operator,
        )
    )
    return TokenCreated(
        id=token_id,
        name=name,
        token=secret,
        created_at=now,
        expires_at=expires_at,
        operator=operator,
    )


def _made_in_session(principal: Principal) -> bool:
    return is_id(principal.token_id, "session")


async def credential_expiry(conn: AsyncConnection, principal: Principal) -> datetime | None:
    """When the credential `principal` acts with ends at the latest, as what it makes inherits
    it: an API token's expiry; for a dashboard session, the expiry of the credential whose
    sign-in link it began from. None: it inherited no bound."""
    if _made_in_session(principal):
        stmt = sa.select(m.sessions.c.credential_expires_at)
        stmt = stmt.where(m.sessions.c.id == principal.token_id)
    else:
        stmt = sa.select(m.api_tokens.c.expires_at)
        stmt = stmt.where(m.api_tokens.c.id == principal.token_id)
    found: datetime | None = await conn.scalar(stmt)
    return found


async def expiry_bound(
    conn: AsyncConnection, principal: Principal, now: datetime
) -> tuple[datetime | None, str]:
    """The latest a token made by `principal` may expire (None: no bound), and why: its
    `credential_expiry`, and for a dashboard session `SESSION_TOKEN_MAX_DAYS` from now."""
    bound = await credential_expiry(conn, principal)
    why = "a token must not outlive the credential that makes it"
    most = now + timedelta(days=SESSION_TOKEN_MAX_DAYS)
    if _made_in_session(principal) and (bound is None or most < bound):
        bound = most
        why = f"a token made from a dashboard session expires within {SESSION_TOKEN_MAX_DAYS} days"
    return bound, why


def _expiry(days: int | None, bound: datetime | None, why: str, now: datetime) -> datetime | None:
    """A new token's expiry: as asked, within the bound (a 422 past it), else the bound."""
    if days is None:
        return bound
    asked = now + timedelta(days=days)
    if bound is None or asked <= bound:
        return asked
    raise field_error(
        "expires_in_days",
        f"{why}, which is {bound.isoformat()}; leave it out to expire then",
    )


async def _within_cap(conn: AsyncConnection, user_id: str, now: datetime, max_live: int) -> None:
    """Refuse (409) a token past the user's live tokens' cap. The user's row is locked first
    (Postgres; SQLite's writes are one at a time), so two requests cannot both take the last
    place."""
    await conn.execute(sa.select(m.users.c.id).where(m.users.c.id == user_id).with_for_update())
    t = m.api_tokens.c
    live = await conn.scalar(
        sa.select(sa.func.count())
        .select_from(m.api_tokens)
        .where(
            t.user_id == user_id,
            t.revoked_at.is_(None),
            sa.or_(t.expires_at.is_(None), t.expires_at > now),
        )
    )
    if (live or 0) >= max_live:
        raise Conflict(
            f"you hold {live} live API tokens, the most one user may "
            f"(EINSORA_API_TOKENS_PER_USER={max_live}); revoke one first (`einsora tokens revoke`)",
            code="too_many_tokens",
        )


async def create(
    store: Store, principal: Principal, body: TokenCreate, *, now: datetime, max_live: int
) -> TokenCreated:
    """A token for the caller, in the caller's tenant; operator rights only from an operator,
    an expiry within `expiry_bound`, and within the user's cap of live tokens."""
    if body.operator and not principal.is_operator:
        raise Forbidden("only an operator token may make a token with operator rights")
    async with store.write() as conn:
        bound, why = await expiry_bound(conn, principal, now)
        expires_at = _expiry(body.expires_in_days, bound, why, now)
        await _within_cap(conn, principal.user_id, now, max_live)
        made = await issue(
            conn,
            tenant_id=principal.tenant_id,
            user_id=principal.user_id,
            name=body.name,
            expires_at=expires_at,
            operator=body.operator,
            now=now,
        )
        activity_target(made.id)
        return made


def _own(principal: Principal) -> sa.ColumnElement[bool]:
    return sa.and_(
        m.api_tokens.c.tenant_id == principal.tenant_id,
        m.api_tokens.c.user_id == principal.user_id,
        m.api_tokens.c.revoked_at.is_(None),
    )


async def list_tokens(store: Store, principal: Principal, query: PageQuery) -> TokenPage:
    """The caller's live tokens (never their secrets), oldest first."""
    stmt = sa.select(
        m.api_tokens.c.id,
        m.api_tokens.c.name,
        m.api_tokens.c.created_at,
        m.api_tokens.c.expires_at,
        m.api_tokens.c.last_used_at,
        m.api_tokens.c.operator,
    ).where(_own(principal))
    async with store.read() as conn:
        items, cursor = await keyset_page(
            conn,
            stmt,
            m.api_tokens.c.id,
            query,
            lambda r: TokenOut.model_validate(r, from_attributes=True),
            lambda t: t.id,
        )
    return TokenPage(items=items, next_cursor=cursor)


async def revoke(store: Store, principal: Principal, token_id: str) -> None:
    """Revoke one of the caller's tokens; it is refused from the next request on."""
    if not is_id(token_id, "token"):
        raise NotFound(f"no API token {token_id!r}")
    async with store.write() as conn:
        result = await conn.execute(
            sa.update(m.api_tokens)
            .where(m.api_tokens.c.id == token_id, _own(principal))
            .values(revoked_at=utcnow())
        )
    if result.rowcount != 1:
        raise NotFound(f"no API token {token_id!r}")
