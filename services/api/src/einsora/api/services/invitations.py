"""Invitations: how a user joins a tenant (ADR-0008).

A tenant's admins (or the operator) invite a username with a role. The invitation never hands
anyone a token for somebody else:
- an **existing user** accepts it themself, signed in with one of their own tokens, and gets a
  token for the new tenant (`accept`); nobody else can accept it, not even the admin who made it;
- a **new user** is made only when the one-time code of their invitation is redeemed
  (`redeem`): the code is shown once to the admin, who hands it over, and only its hash is kept.
Tokens made either way never carry operator rights.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Conflict, Forbidden, NotFound
from einsora.api.pagination import keyset_page
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.tenants import (
    InvitationCreate,
    InvitationCreated,
    InvitationOut,
    InvitationPage,
    InvitationRedeem,
    Joined,
    Role,
    TenantRef,
    UserOut,
)
from einsora.api.services import tokens
from einsora.api.services.tenants import visible_tenant
from einsora.api.store import Store, activity_actor, activity_target
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import utcnow

CODE_PREFIX = "inv_"


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


_COLUMNS = (
    m.invitations.c.id,
    m.invitations.c.username,
    m.invitations.c.role,
    m.invitations.c.user_id,
    m.invitations.c.created_at,
    m.invitations.c.expires_at,
    m.invitations.c.accepted_at,
    m.invitations.c.revoked_at,
    m.tenants.c.id.label("tenant_id"),
    m.tenants.c.name.label("tenant_name"),
)


def _select() -> sa.Select[tuple[object, ...]]:
    return sa.select(*_COLUMNS).join(m.tenants, m.tenants.c.id == m.invitations.c.tenant_id)


def _out(row: Row[tuple[object, ...]]) -> InvitationOut:
    r = row._mapping
    return InvitationOut(
        id=r["id"],
        tenant=TenantRef(id=r["tenant_id"], name=r["tenant_name"]),
        username=r["username"],
        role=Role(r["role"]),
        existing_user=r["user_id"] is not None,
        created_at=r["created_at"],
        expires_at=r["expires_at"],
        accepted_at=r["accepted_at"],
        revoked_at=r["revoked_at"],
    )


def _pending() -> sa.ColumnElement[bool]:
    return sa.and_(
        m.invitations.c.accepted_at.is_(None),
        m.invitations.c.revoked_at.is_(None),
        m.invitations.c.expires_at > utcnow(),
    )


def _require_admin(principal: Principal, tenant: TenantRef) -> None:
    if not (principal.is_operator or (principal.is_admin and principal.tenant_id == tenant.id)):
        raise Forbidden("only a tenant's admins invite members and see its invitations")


async def invite(
    store: Store, principal: Principal, tenant_id: str, body: InvitationCreate
) -> InvitationCreated:
    """Invite `body.username` into the tenant; a new user's one-time code is in the answer."""
    now = utcnow()
    async with store.write() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        _require_admin(principal, tenant)
        user_id = await conn.scalar(
            sa.select(m.users.c.id).where(m.users.c.username == body.username)
        )
        if user_id is not None:
            member = await conn.scalar(
                sa.select(m.members.c.role).where(
                    m.members.c.tenant_id == tenant.id, m.members.c.user_id == user_id
                )
            )
            if member is not None:
                raise Conflict(
                    f"{body.username} is a member of {tenant.name} already", code="already_member"
                )
        open_one = await conn.scalar(
            sa.select(m.invitations.c.id).where(
                m.invitations.c.tenant_id == tenant.id,
                m.invitations.c.username == body.username,
                _pending(),
            )
        )
        if open_one is not None:
            raise Conflict(
                f"{body.username} has an open invitation to {tenant.name} already ({open_one}); "
                "revoke it to make another",
                code="already_invited",
            )
        code = None if user_id is not None else CODE_PREFIX + secrets.token_urlsafe(32)
        invitation_id = new_id("invitation")
        expires_at = now + timedelta(days=body.expires_in_days)
        await conn.execute(
            sa.insert(m.invitations).values(
                id=invitation_id,
                tenant_id=tenant.id,
                username=body.username,
                role=body.role.value,
                user_id=user_id,
                secret_sha256=None if code is None else _digest(code),
                invited_by=principal.user_id,
                created_at=now,
                expires_at=expires_at,
            )
        )
    return InvitationCreated(
        id=invitation_id,
        tenant=tenant,
        username=body.username,
        role=body.role,
        existing_user=user_id is not None,
        created_at=now,
        expires_at=expires_at,
        accepted_at=None,
        revoked_at=None,
        code=code,
    )


async def _page(
    conn: AsyncConnection, stmt: sa.Select[tuple[object, ...]], query: PageQuery
) -> InvitationPage:
    items, cursor = await keyset_page(conn, stmt, m.invitations.c.id, query, _out, lambda i: i.id)
    return InvitationPage(items=items, next_cursor=cursor)


async def list_for_tenant(
    store: Store, principal: Principal, tenant_id: str, query: PageQuery
) -> InvitationPage:
    """Every invitation of a tenant, for its admins (codes are never shown again)."""
    async with store.read() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        _require_admin(principal, tenant)
        return await _page(conn, _select().where(m.invitations.c.tenant_id == tenant.id), query)


async def list_mine(store: Store, principal: Principal, query: PageQuery) -> InvitationPage:
    """The open invitations addressed to the caller's user, into any tenant."""
    stmt = _select().where(m.invitations.c.user_id == principal.user_id, _pending())
    async with store.read() as conn:
        return await _page(conn, stmt, query)


async def revoke(store: Store, principal: Principal, tenant_id: str, invitation_id: str) -> None:
    """Withdraw an open invitation; its code or acceptance no longer works."""
    async with store.write() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        _require_admin(principal, tenant)
        result = await conn.execute(
            sa.update(m.invitations)
            .where(
                m.invitations.c.id == invitation_id,
                m.invitations.c.tenant_id == tenant.id,
                m.invitations.c.accepted_at.is_(None),
                m.invitations.c.revoked_at.is_(None),
            )
            .values(revoked_at=utcnow())
        )
    if result.rowcount != 1:
        raise NotFound(f"no open invitation {invitation_id!r} in {tenant.name}")


async def _claim(conn: AsyncConnection, where: sa.ColumnElement[bool]) -> Row[tuple[object, ...]]:
    """Mark one open invitation accepted, exactly once even under races; its row."""
    row = (await conn.execute(_select().where(where, _pending()))).first()
    if row is None:
        raise NotFound("no open invitation: it does not exist, was used, revoked or expired")
    claimed = await conn.execute(
        sa.update(m.invitations)
        .where(m.invitations.c.id == row.id, _pending())
        .values(accepted_at=utcnow())
    )
    if claimed.rowcount != 1:
        raise NotFound("no open invitation: it does not exist, was used, revoked or expired")
    return row


async def admit(
    conn: AsyncConnection, row: Row[tuple[object, ...]], user_id: str
) -> tuple[TenantRef, Role]:
    """Make `user_id` a member of the claimed invitation's tenant, with its role."""
    r = row._mapping
    tenant = TenantRef(id=r["tenant_id"], name=r["tenant_name"])
    already = await conn.scalar(
        sa.select(m.members.c.role).where(
            m.members.c.tenant_id == tenant.id, m.members.c.user_id == user_id
        )
    )
    if already is not None:
        raise Conflict(
            f"{r['username']} is a member of {tenant.name} already", code="already_member"
        )
    await conn.execute(
        sa.insert(m.members).values(
            tenant_id=tenant.id, user_id=user_id, role=r["role"], created_at=utcnow()
        )
    )
    return tenant, Role(r["role"])


async def _join(
    conn: AsyncConnection,
    row: Row[tuple[object, ...]],
    user_id: str,
    token_name: str,
    expires_at: datetime | None = None,
) -> Joined:
    tenant, role = await admit(conn, row, user_id)
    token = await tokens.issue(
        conn, tenant_id=tenant.id, user_id=user_id, name=token_name, expires_at=expires_at
    )
    return Joined(
        user=UserOut(id=user_id, username=row._mapping["username"]),
        tenant=tenant,
        role=role,
        token=token,
    )


async def accept(store: Store, principal: Principal, invitation_id: str) -> Joined:
    """The caller accepts an invitation addressed to them; a token of theirs for that tenant."""
    if not is_id(invitation_id, "invitation"):
        raise NotFound(f"no invitation {invitation_id!r}")
    async with store.write() as conn:
        row = await _claim(
            conn,
            sa.and_(
                m.invitations.c.id == invitation_id,
                m.invitations.c.user_id == principal.user_id,
            ),
        )
        # The new token never outlives the credential that accepted (issue 34, N12).
        bound, _ = await tokens.expiry_bound(conn, principal, utcnow())
        return await _join(conn, row, principal.user_id, f"joined {row.tenant_name}", bound)


async def redeem(store: Store, body: InvitationRedeem) -> Joined:
    """A new user opens their invitation's code: the user is made, with their first token."""
    async with store.write() as conn:
        row, user_id = await claim_for_new_user(conn, body.code)
        return await _join(conn, row, user_id, f"first token in {row.tenant_name}")


async def claim_for_new_user(
    conn: AsyncConnection, code: str, *, password_hash: str | None = None
) -> tuple[Row[tuple[object, ...]], str]:
    """Claim the open invitation of a new user by its code, and make that user (with a
    password's hash, when the dashboard's invitation link set one): the invitation's row and
    the new user's id. The caller makes the membership (`admit`) in the same transaction."""
    row = await _claim(
        conn,
        sa.and_(
            m.invitations.c.secret_sha256 == _digest(code),
            m.invitations.c.user_id.is_(None),
        ),
    )
    username = row._mapping["username"]
    # No token authenticated the redeemer: its row names the tenant (and the new user).
    activity_actor(tenant_id=row._mapping["tenant_id"], user_id=None)
    activity_target(row._mapping["id"])
    taken = await conn.scalar(sa.select(m.users.c.id).where(m.users.c.username == username))
    if taken is not None:
        raise Conflict(
            f"a user named {username!r} exists now; ask for an invitation to that user, "
            "who accepts it signed in",
            code="username_taken",
        )
    user_id = new_id("user")
    now = utcnow()
    await conn.execute(
        sa.insert(m.users).values(
            id=user_id,
            username=username,
            created_at=now,
            password_hash=password_hash,
            password_set_at=now if password_hash is not None else None,
        )
    )
    activity_actor(tenant_id=row._mapping["tenant_id"], user_id=user_id)
    return row, user_id
