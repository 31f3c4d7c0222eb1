"""One-time sign-in links to the dashboard (ADR-0019): minted for the caller alone (`einsora
dashboard`), or for the owner on Solo's first start; exchanged for a session once
(`sessions.sign_in_with_link`). Only the code's SHA-256 is stored; the code rides in the link's
fragment, which no server sees."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.bootstrap import OWNER_TENANT, OWNER_USERNAME
from einsora.api.schemas.sessions import SignInLinkCreate, SignInLinkCreated
from einsora.api.services import tokens
from einsora.api.store import Store, activity_target
from einsora.common.ids import new_id

SIGN_IN_PREFIX = "sil_"
FIRST_START_LINK_MINUTES = 60
"""How long the owner's link from Solo's first start stays valid (`einsora dashboard` prints
a fresh one at any time)."""
SIGN_IN_PATH = "/sign-in#link="


def digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


async def _insert_link(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    user_id: str,
    operator: bool,
    now: datetime,
    minutes: int,
    credential_expires_at: datetime | None = None,
) -> SignInLinkCreated:
    link_id, code = new_id("sign_in_link"), SIGN_IN_PREFIX + secrets.token_urlsafe(32)
    expires_at = now + timedelta(minutes=minutes)
    if credential_expires_at is not None:  # never past its maker's (issue 34, N12)
        expires_at = min(expires_at, credential_expires_at)
    await conn.execute(
        sa.insert(m.sign_in_links).values(
            id=link_id,
            secret_sha256=digest(code),
            tenant_id=tenant_id,
            user_id=user_id,
            operator=operator,
            created_at=now,
            expires_at=expires_at,
            credential_expires_at=credential_expires_at,
        )
    )
    return SignInLinkCreated(id=link_id, code=code, path=SIGN_IN_PATH + code, expires_at=expires_at)


async def mint_link(
    store: Store, principal: Principal, body: SignInLinkCreate, now: datetime
) -> SignInLinkCreated:
    """A one-time sign-in link for the caller themself, in the caller's tenant, with the
    caller's operator rights and the expiry of the caller's credential (never more)."""
    async with store.write() as conn:
        made = await _insert_link(
            conn,
            tenant_id=principal.tenant_id,
            user_id=principal.user_id,
            operator=principal.is_operator,
            now=now,
            minutes=body.expires_in_minutes,
            credential_expires_at=await tokens.credential_expiry(conn, principal),
        )
        activity_target(made.id)
        return made


async def mint_owner_link(store: Store, now: datetime) -> SignInLinkCreated | None:
    """The owner's sign-in link, for Solo's first start (None before the owner exists)."""
    async with store.write() as conn:
        owner = (
            sa.select(
                m.users.c.id.label("user_id"),
                m.users.c.is_operator,
                m.tenants.c.id.label("tenant_id"),
            )
            .select_from(m.members)
            .join(m.users, m.users.c.id == m.members.c.user_id)
            .join(m.tenants, m.tenants.c.id == m.members.c.tenant_id)
            .where(m.users.c.username == OWNER_USERNAME, m.tenants.c.name == OWNER_TENANT)
        )
        row = (await conn.execute(owner)).first()
        if row is None:
            return None
        return await _insert_link(
            conn,
            tenant_id=row.tenant_id,
            user_id=row.user_id,
            operator=bool(row.is_operator),
            now=now,
            minutes=FIRST_START_LINK_MINUTES,
        )
