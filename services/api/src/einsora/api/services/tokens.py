"""API tokens: issue (the secret returned once, its hash stored), list, revoke.

A token belongs to one user in one tenant, and is only ever minted for the caller themself (or
for a new user redeeming their invitation: ADR-0008). A user sees and revokes only their own
tokens, and anyone else's token id answers 404. Operator rights are the token's own: only an
operator token may mint another one that carries them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal, new_secret, secret_hash
from einsora.api.errors import Forbidden, NotFound
from einsora.api.pagination import keyset_page
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.tokens import TokenCreate, TokenCreated, TokenOut, TokenPage
from einsora.api.store import Store, activity_target
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import utcnow


async def issue(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    user_id: str,
    name: str,
    expires_in_days: int | None = None,
    operator: bool = False,
    now: datetime | None = None,
) -> TokenCreated:
    """A new token for `user_id` in `tenant_id`, inside the caller's transaction."""
    now = now or utcnow()
    secret = new_secret()
    token_id = new_id("token")
    expires_at = now + timedelta(days=expires_in_days) if expires_in_days else None
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


async def create(store: Store, principal: Principal, body: TokenCreate) -> TokenCreated:
    """A token for the caller, in the caller's tenant; operator rights only from an operator."""
    if body.operator and not principal.is_operator:
        raise Forbidden("only an operator token may make a token with operator rights")
    async with store.write() as conn:
        made = await issue(
            conn,
            tenant_id=principal.tenant_id,
            user_id=principal.user_id,
            name=body.name,
            expires_in_days=body.expires_in_days,
            operator=body.operator,
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
