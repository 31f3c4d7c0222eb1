"""Offboarding a tenant's members (issue 34, N11): change a member's role, revoke every
credential a member holds in the tenant, or remove the member.

Only the tenant's admins and the operator may; a member is refused (403) before anything about
the user is looked up, and another tenant answers 404. A member is named by user id or
username. An operator user's membership is the operator's alone to change, and a tenant always
keeps an admin (409): the admins' rows are locked while one is demoted or removed, so that two
admins demoting each other at once cannot leave none.

A member's credentials in the tenant are their API tokens, dashboard sessions, inference
gateway keys and machine join tokens (and any sign-in link not yet opened): removing a member
revokes all of them in the same transaction as the membership, so a departed member is refused
by every replica as soon as the router has told the others (`ApiContext.revoked`, the gateway
key sync), and inviting them back later revives none. What the member made for the tenant
stays the tenant's: workloads keep running, machines they enrolled stay enrolled, usage stays
accounted. A role change revokes nothing, but every replica forgets the member's verified
credentials, so the new role holds from their next request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Conflict, Forbidden, NotFound
from einsora.api.schemas.members import CredentialsRevoked, MemberRemoved, MemberRole
from einsora.api.schemas.tenants import MemberOut, Role, TenantRef, UserOut
from einsora.api.services.tenants import visible_tenant
from einsora.api.store import Store
from einsora.common.ids import is_id


@dataclass
class Offboarded:
    """What an offboarding changed: the answer, the credentials every replica must drop from
    its cache of verified ones, and the gateway keys to take off the bus."""

    answer: CredentialsRevoked
    forget: list[str] = field(default_factory=list)
    gateway_keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Member:
    tenant: TenantRef
    user: UserOut
    role: str
    joined_at: datetime


async def _member(
    conn: AsyncConnection, principal: Principal, tenant_id: str, user: str
) -> _Member:
    """The member `user` of a tenant the caller may offboard in (404 for another tenant or no
    such member, 403 for a caller who is not its admin or the operator)."""
    tenant = await visible_tenant(conn, principal, tenant_id)
    if not (principal.is_operator or principal.is_admin):
        raise Forbidden("only a tenant's admins (and the operator) change its members")
    named = m.users.c.id == user if is_id(user, "user") else m.users.c.username == user
    row = (
        await conn.execute(
            sa.select(
                m.users.c.id,
                m.users.c.username,
                m.users.c.is_operator,
                m.members.c.role,
                m.members.c.created_at,
            )
            .join(m.users, m.users.c.id == m.members.c.user_id)
            .where(m.members.c.tenant_id == tenant.id, named)
        )
    ).first()
    if row is None:
        raise NotFound(f"no member {user!r} in {tenant.name}")
    if row.is_operator and not principal.is_operator:
        raise Forbidden(
            f"{row.username} is the operator: only the operator changes their memberships",
            code="operator_member",
        )
    return _Member(tenant, UserOut(id=row.id, username=row.username), row.role, row.created_at)


async def _keep_an_admin(conn: AsyncConnection, member: _Member) -> None:
    """Refuse (409) to leave the tenant without an admin; the admins' rows stay locked until
    the change commits (Postgres; SQLite's writes are one at a time)."""
    admins = (
        await conn.execute(
            sa.select(m.members.c.user_id)
            .where(m.members.c.tenant_id == member.tenant.id, m.members.c.role == Role.admin)
            .with_for_update()
        )
    ).scalars()
    if set(admins) <= {member.user.id}:
        raise Conflict(
            f"{member.user.username} is the last admin of {member.tenant.name}: make another "
            "member admin first",
            code="last_admin",
        )


def _theirs(table: sa.Table, member: _Member) -> sa.ColumnElement[bool]:
    return sa.and_(table.c.tenant_id == member.tenant.id, table.c.user_id == member.user.id)


async def _live_ids(conn: AsyncConnection, table: sa.Table, where: Any) -> list[str]:
    return list((await conn.execute(sa.select(table.c.id).where(where))).scalars())


async def _revoke_all(conn: AsyncConnection, member: _Member, now: datetime) -> Offboarded:
    """Revoke every credential the member holds in the tenant, in the caller's transaction."""
    t, s, k = m.api_tokens, m.sessions, m.gateway_keys
    tokens = await _live_ids(conn, t, sa.and_(_theirs(t, member), t.c.revoked_at.is_(None)))
    sessions = await _live_ids(conn, s, sa.and_(_theirs(s, member), s.c.ended_at.is_(None)))
    keys = await _live_ids(conn, k, sa.and_(_theirs(k, member), k.c.revoked_at.is_(None)))
    if tokens:
        await conn.execute(sa.update(t).where(t.c.id.in_(tokens)).values(revoked_at=now))
    if sessions:
        await conn.execute(sa.update(s).where(s.c.id.in_(sessions)).values(ended_at=now))
    if keys:
        await conn.execute(sa.update(k).where(k.c.id.in_(keys)).values(revoked_at=now))
    j, links = m.join_tokens, m.sign_in_links
    joins = await conn.execute(
        sa.update(j).where(_theirs(j, member), j.c.revoked_at.is_(None)).values(revoked_at=now)
    )
    await conn.execute(
        sa.update(links)
        .where(_theirs(links, member), links.c.used_at.is_(None), links.c.expires_at > now)
        .values(expires_at=now)
    )
    answer = CredentialsRevoked(
        user=member.user,
        tenant=member.tenant,
        api_tokens=len(tokens),
        sessions=len(sessions),
        gateway_keys=len(keys),
        join_tokens=joins.rowcount,
    )
    return Offboarded(answer, [*tokens, *sessions], keys)


async def set_role(
    store: Store, principal: Principal, tenant_id: str, user: str, body: MemberRole
) -> tuple[MemberOut, list[str]]:
    """Give a member another role: the member, and their live credentials in the tenant (which
    every replica must forget, so that their next request reads the new role)."""
    async with store.write() as conn:
        member = await _member(conn, principal, tenant_id, user)
        if member.role == Role.admin and body.role != Role.admin:
            await _keep_an_admin(conn, member)
        await conn.execute(
            sa.update(m.members)
            .where(m.members.c.tenant_id == member.tenant.id, m.members.c.user_id == member.user.id)
            .values(role=body.role.value)
        )
        t, s = m.api_tokens, m.sessions
        live = [
            *await _live_ids(conn, t, sa.and_(_theirs(t, member), t.c.revoked_at.is_(None))),
            *await _live_ids(conn, s, sa.and_(_theirs(s, member), s.c.ended_at.is_(None))),
        ]
    out = MemberOut(
        user=member.user, tenant=member.tenant, role=body.role, created_at=member.joined_at
    )
    return out, live


async def revoke_credentials(
    store: Store, principal: Principal, tenant_id: str, user: str, now: datetime
) -> Offboarded:
    """Revoke every credential a member holds in the tenant; the membership stays."""
    async with store.write() as conn:
        member = await _member(conn, principal, tenant_id, user)
        return await _revoke_all(conn, member, now)


async def remove(
    store: Store, principal: Principal, tenant_id: str, user: str, now: datetime
) -> Offboarded:
    """Remove a member from the tenant, every credential of theirs there revoked at once."""
    async with store.write() as conn:
        member = await _member(conn, principal, tenant_id, user)
        if member.role == Role.admin:
            await _keep_an_admin(conn, member)
        done = await _revoke_all(conn, member, now)
        await conn.execute(
            sa.delete(m.members).where(
                m.members.c.tenant_id == member.tenant.id, m.members.c.user_id == member.user.id
            )
        )
    done.answer = MemberRemoved(**done.answer.model_dump())
    return done
