"""Dashboard sessions: beginning one (a one-time link, a password, an invitation link), what the
dashboard learns of it, ending it; a user's own password (ADR-0019). The links are
`sign_in_links.py`'s.

A session, like an API token, belongs to one user in one tenant, and is only ever begun for
whoever proves to be that user: the holder of a one-time link minted for them (Solo's first
start mints the owner's; `POST /v1/sign-in-links` mints one for its caller alone), the user's
password, or a new user's invitation code.

A session has what the credential it began from had, never more (issue 34, N2 and N12).
Operator rights follow ADR-0008: a session carries them only when its user is an operator and
it began from a link minted with operator rights, or from a password set with them
(`users.password_operator`: set by a credential that carried them, or by one that proved the
current password that did). A link minted with an expiring credential ends its session then at
the latest, and a credential that expires may not set a first password (which does not).

Password sign-ins are throttled in the store (`passwords.SignInThrottle`), and a failed or
refused one of a known user is in the activity log of the tenant it named (else of the first
it joined), never with the password; one for a username nobody has is only logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Forbidden, NotFound, RateLimited, Unauthenticated, field_error
from einsora.api.passwords import SignInThrottle, hash_password, needs_rehash, verify_password
from einsora.api.schemas.sessions import (
    InvitationSignUp,
    PasswordChange,
    PasswordSignIn,
    SessionMethod,
    SessionOut,
)
from einsora.api.schemas.tenants import Role, TenantRef, UserOut
from einsora.api.services import invitations, tokens
from einsora.api.services.sign_in_links import digest
from einsora.api.session_auth import csrf_token, new_session_secret
from einsora.api.store import Store, activity_actor, activity_target
from einsora.common.ids import new_id

log = logging.getLogger("einsora.api.sessions")

_LINK_REFUSED = (
    "this sign-in link is unknown, used or expired: links work once, for a short while; "
    "`einsora dashboard` prints a new one"
)


@dataclass(frozen=True)
class Began:
    """A session just begun: its secret goes into the cookie, and nowhere else."""

    secret: str
    principal: Principal
    method: SessionMethod
    expires_at: datetime
    has_password: bool


async def _begin(
    conn: AsyncConnection,
    *,
    tenant: TenantRef,
    user: UserOut,
    role: str,
    operator: bool,
    method: SessionMethod,
    now: datetime,
    max_age: timedelta,
    has_password: bool,
    credential_expires_at: datetime | None = None,
) -> Began:
    session_id, secret = new_id("session"), new_session_secret()
    expires_at = now + max_age
    if credential_expires_at is not None:
        expires_at = min(expires_at, credential_expires_at)
    await conn.execute(
        sa.insert(m.sessions).values(
            id=session_id,
            secret_sha256=digest(secret),
            tenant_id=tenant.id,
            user_id=user.id,
            operator=operator,
            method=method.value,
            created_at=now,
            last_seen_at=now,
            expires_at=expires_at,
            credential_expires_at=credential_expires_at,
        )
    )
    activity_actor(tenant_id=tenant.id, user_id=user.id, token_id=session_id)
    activity_target(session_id)
    principal = Principal(
        token_id=session_id,
        user_id=user.id,
        username=user.username,
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        role=role,
        is_operator=operator,
    )
    return Began(secret, principal, method, expires_at, has_password)


_MEMBERSHIP = (
    sa.select(
        m.users.c.id.label("user_id"),
        m.users.c.username,
        m.users.c.is_operator,
        m.users.c.password_hash,
        m.users.c.password_operator,
        m.tenants.c.id.label("tenant_id"),
        m.tenants.c.name.label("tenant_name"),
        m.members.c.role,
    )
    .select_from(m.members)
    .join(m.users, m.users.c.id == m.members.c.user_id)
    .join(m.tenants, m.tenants.c.id == m.members.c.tenant_id)
)


async def sign_in_with_link(store: Store, code: str, *, now: datetime, max_age: timedelta) -> Began:
    """Exchange a one-time sign-in link's code for a session (401 when it is unknown, used or
    expired: a link works exactly once, decided by one conditional UPDATE)."""
    code_sha256 = digest(code)
    async with store.write() as conn:
        link = (
            await conn.execute(
                sa.select(m.sign_in_links).where(m.sign_in_links.c.secret_sha256 == code_sha256)
            )
        ).first()
        if link is None:
            raise Unauthenticated(_LINK_REFUSED, code="sign_in_link_refused")
        claimed = await conn.execute(
            sa.update(m.sign_in_links)
            .where(
                m.sign_in_links.c.id == link.id,
                m.sign_in_links.c.used_at.is_(None),
                m.sign_in_links.c.expires_at > now,
            )
            .values(used_at=now)
        )
        if claimed.rowcount != 1:
            raise Unauthenticated(_LINK_REFUSED, code="sign_in_link_refused")
        row = (
            await conn.execute(
                _MEMBERSHIP.where(
                    m.members.c.user_id == link.user_id, m.members.c.tenant_id == link.tenant_id
                )
            )
        ).first()
        if row is None:
            raise Unauthenticated(_LINK_REFUSED, code="sign_in_link_refused")
        return await _begin(
            conn,
            tenant=TenantRef(id=row.tenant_id, name=row.tenant_name),
            user=UserOut(id=row.user_id, username=row.username),
            role=row.role,
            operator=bool(link.operator) and bool(row.is_operator),
            method=SessionMethod.link,
            now=now,
            max_age=max_age,
            has_password=row.password_hash is not None,
            credential_expires_at=link.credential_expires_at,
        )


def _membership(user_id: str, tenant: str | None) -> sa.Select[tuple[object, ...]]:
    """The membership a password sign-in enters: in the tenant named, else the first joined."""
    stmt = _MEMBERSHIP.where(m.members.c.user_id == user_id)
    if tenant is not None:
        stmt = stmt.where(m.tenants.c.name == tenant)
    return stmt.order_by(m.members.c.created_at).limit(1)


async def _record_failure(store: Store, body: PasswordSignIn, address: str) -> None:
    """Name who a failed or refused password sign-in was for, so that the edge records it in
    their tenant's activity log (no row when nobody has the username: it is only logged)."""
    async with store.read() as conn:
        user_id = await conn.scalar(
            sa.select(m.users.c.id).where(m.users.c.username == body.username)
        )
        row = None
        if user_id is not None:
            row = (await conn.execute(_membership(user_id, body.tenant))).first()
            if row is None and body.tenant is not None:
                row = (await conn.execute(_membership(user_id, None))).first()
    if row is None:
        log.info("password sign-in failed for no member", extra={"address": address})
        return
    activity_actor(tenant_id=row.tenant_id, user_id=row.user_id)
    activity_target(row.user_id)


async def sign_in_with_password(
    store: Store,
    body: PasswordSignIn,
    *,
    throttle: SignInThrottle,
    address: str,
    now: datetime,
    max_age: timedelta,
) -> Began:
    """A session for the user whose password this is, in the tenant named (or the first they
    joined); 401 for a wrong username or password, without saying which; 429 past the throttle,
    whose count each attempt joins before its password is checked."""
    try:
        await throttle.claim(store, body.username, address, now)
    except RateLimited:
        await _record_failure(store, body, address)
        raise
    async with store.read() as conn:
        user = (
            await conn.execute(
                sa.select(m.users.c.id, m.users.c.password_hash).where(
                    m.users.c.username == body.username
                )
            )
        ).first()
    stored = None if user is None else user.password_hash
    if not await verify_password(stored, body.password):
        await _record_failure(store, body, address)
        raise Unauthenticated("wrong username or password", code="sign_in_failed")
    assert user is not None
    assert stored is not None
    await throttle.succeeded(store, body.username, address)
    renewed = await hash_password(body.password) if needs_rehash(stored) else None
    async with store.write() as conn:
        row = (await conn.execute(_membership(user.id, body.tenant))).first()
        if row is None:
            if body.tenant is not None:
                raise field_error("tenant", f"you are not a member of {body.tenant}")
            raise Forbidden("you are a member of no tenant any more", code="no_tenant")
        if renewed is not None:
            await conn.execute(
                sa.update(m.users).where(m.users.c.id == user.id).values(password_hash=renewed)
            )
        return await _begin(
            conn,
            tenant=TenantRef(id=row.tenant_id, name=row.tenant_name),
            user=UserOut(id=row.user_id, username=row.username),
            role=row.role,
            # The password's own rights: an operator's only when it was set with them.
            operator=bool(row.is_operator) and bool(row.password_operator),
            method=SessionMethod.password,
            now=now,
            max_age=max_age,
            has_password=True,
        )


async def join_with_invitation(
    store: Store, body: InvitationSignUp, *, now: datetime, max_age: timedelta
) -> Began:
    """A new user redeems their invitation from its link, with the password they chose: the
    user, the membership and a session, in one transaction (no API token is made)."""
    password_hash = await hash_password(body.password)
    async with store.write() as conn:
        row, user_id = await invitations.claim_for_new_user(
            conn, body.code, password_hash=password_hash
        )
        tenant, role = await invitations.admit(conn, row, user_id)
        return await _begin(
            conn,
            tenant=tenant,
            user=UserOut(id=user_id, username=row._mapping["username"]),
            role=role.value,
            operator=False,
            method=SessionMethod.invitation,
            now=now,
            max_age=max_age,
            has_password=True,
        )


async def current(
    store: Store, principal: Principal, secret: str, *, idle: timedelta, gateway_url: str
) -> SessionOut:
    """The caller's session as the dashboard sees it (404 when the request used an API token)."""
    stmt = (
        sa.select(m.sessions.c.method, m.sessions.c.expires_at, m.users.c.password_hash)
        .join(m.users, m.users.c.id == m.sessions.c.user_id)
        .where(m.sessions.c.id == principal.token_id)
    )
    async with store.read() as conn:
        row = (await conn.execute(stmt)).first()
    if row is None:
        raise NotFound("this request is not a dashboard session's (it used an API token)")
    return SessionOut(
        id=principal.token_id,
        user=UserOut(id=principal.user_id, username=principal.username),
        tenant=TenantRef(id=principal.tenant_id, name=principal.tenant_name),
        role=Role(principal.role),
        operator=principal.is_operator,
        method=SessionMethod(row.method),
        csrf_token=csrf_token(secret),
        expires_at=row.expires_at,
        idle_timeout_s=idle.total_seconds(),
        has_password=row.password_hash is not None,
        gateway_url=gateway_url,
    )


def began_out(began: Began, *, idle: timedelta, gateway_url: str) -> SessionOut:
    p = began.principal
    return SessionOut(
        id=p.token_id,
        user=UserOut(id=p.user_id, username=p.username),
        tenant=TenantRef(id=p.tenant_id, name=p.tenant_name),
        role=Role(p.role),
        operator=p.is_operator,
        method=began.method,
        csrf_token=csrf_token(began.secret),
        expires_at=began.expires_at,
        idle_timeout_s=idle.total_seconds(),
        has_password=began.has_password,
        gateway_url=gateway_url,
    )


async def end(store: Store, principal: Principal, now: datetime) -> None:
    """Sign out: the session ends on the server, for good (404 for an API token's request)."""
    activity_target(principal.token_id)
    async with store.write() as conn:
        result = await conn.execute(
            sa.update(m.sessions)
            .where(m.sessions.c.id == principal.token_id, m.sessions.c.ended_at.is_(None))
            .values(ended_at=now)
        )
    if result.rowcount != 1:
        raise NotFound("this request is not a dashboard session's (it used an API token)")


async def set_password(
    store: Store, principal: Principal, body: PasswordChange, now: datetime
) -> list[str]:
    """Set or change the caller's own password; changing one needs the current one, and setting
    the first a credential that does not expire (403: the password would outlive it). The
    password signs in with operator rights only when the caller has them, or proved a current
    password that had. Every other session of the user ends (their ids are returned, to be
    dropped everywhere)."""
    if body.password.casefold() == principal.username.casefold():
        raise field_error("password", "must not be your username")
    async with store.read() as conn:
        user = (
            await conn.execute(
                sa.select(m.users.c.password_hash, m.users.c.password_operator).where(
                    m.users.c.id == principal.user_id
                )
            )
        ).one()
        bound = await tokens.credential_expiry(conn, principal)
    operator = principal.is_operator
    if user.password_hash is not None:
        if body.current_password is None:
            raise field_error("current_password", "is required to change your password")
        if not await verify_password(user.password_hash, body.current_password):
            raise field_error("current_password", "does not match your password")
        operator = operator or bool(user.password_operator)
    elif bound is not None:
        raise Forbidden(
            f"this credential expires at {bound.isoformat()} and a password does not: set your "
            "first password with a credential that does not expire (an API token without an "
            "expiry, or the dashboard signed in with its link)",
            code="credential_expires",
        )
    renewed = await hash_password(body.password)
    activity_target(principal.user_id)
    async with store.write() as conn:
        await conn.execute(
            sa.update(m.users)
            .where(m.users.c.id == principal.user_id)
            .values(password_hash=renewed, password_set_at=now, password_operator=operator)
        )
        others = (
            await conn.execute(
                sa.select(m.sessions.c.id).where(
                    m.sessions.c.user_id == principal.user_id,
                    m.sessions.c.id != principal.token_id,
                    m.sessions.c.ended_at.is_(None),
                )
            )
        ).scalars()
        ended = list(others)
        if ended:
            await conn.execute(
                sa.update(m.sessions).where(m.sessions.c.id.in_(ended)).values(ended_at=now)
            )
    return ended
