"""Tenants, users and members.

A token acts in one tenant. The operator (the owner, in Solo) creates tenants and may address
any of them; anyone else sees only their token's tenant, and any other tenant id answers 404.
Members join by invitation (`services/invitations.py`, ADR-0008); nobody is given a token for
someone else.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Conflict, Forbidden, NotFound
from einsora.api.pagination import keyset_page
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.tenants import (
    MemberOut,
    MemberPage,
    MeOut,
    Role,
    TenantCreate,
    TenantOut,
    TenantPage,
    TenantRef,
    UserOut,
)
from einsora.api.store import Store, activity_target
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import utcnow


def me(principal: Principal) -> MeOut:
    return MeOut(
        user=UserOut(id=principal.user_id, username=principal.username),
        tenant=TenantRef(id=principal.tenant_id, name=principal.tenant_name),
        role=Role(principal.role),
        operator=principal.is_operator,
    )


async def create_tenant(store: Store, principal: Principal, body: TenantCreate) -> TenantOut:
    if not principal.is_operator:
        raise Forbidden("only the operator creates tenants")
    now = utcnow()
    tenant = TenantOut(id=new_id("tenant"), name=body.name, created_at=now)
    activity_target(tenant.id)
    async with store.write() as conn:
        taken = await conn.scalar(sa.select(m.tenants.c.id).where(m.tenants.c.name == body.name))
        if taken is not None:
            raise Conflict(f"a tenant named {body.name!r} exists already", code="name_taken")
        await conn.execute(sa.insert(m.tenants).values(**tenant.model_dump()))
    return tenant


async def list_tenants(store: Store, principal: Principal, query: PageQuery) -> TenantPage:
    """The operator sees every tenant; anyone else only their token's tenant."""
    stmt = sa.select(m.tenants.c.id, m.tenants.c.name, m.tenants.c.created_at)
    if not principal.is_operator:
        stmt = stmt.where(m.tenants.c.id == principal.tenant_id)
    async with store.read() as conn:
        items, cursor = await keyset_page(
            conn,
            stmt,
            m.tenants.c.id,
            query,
            lambda r: TenantOut.model_validate(r, from_attributes=True),
            lambda t: t.id,
        )
    return TenantPage(items=items, next_cursor=cursor)


async def visible_tenant(conn: AsyncConnection, principal: Principal, tenant_id: str) -> TenantRef:
    """A tenant the caller may address, else 404 (never 403: its existence is not told)."""
    visible = principal.is_operator or tenant_id == principal.tenant_id
    row = None
    if visible and is_id(tenant_id, "tenant"):
        row = (
            await conn.execute(
                sa.select(m.tenants.c.id, m.tenants.c.name).where(m.tenants.c.id == tenant_id)
            )
        ).first()
    if row is None:
        raise NotFound(f"no tenant {tenant_id!r}")
    return TenantRef(id=row.id, name=row.name)


async def list_members(
    store: Store, principal: Principal, tenant_id: str, query: PageQuery
) -> MemberPage:
    stmt = (
        sa.select(m.users.c.id, m.users.c.username, m.members.c.role, m.members.c.created_at)
        .join(m.users, m.users.c.id == m.members.c.user_id)
        .where(m.members.c.tenant_id == tenant_id)
    )
    async with store.read() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        items, cursor = await keyset_page(
            conn,
            stmt,
            m.users.c.id,
            query,
            lambda r: MemberOut(
                user=UserOut(id=r.id, username=r.username),
                tenant=tenant,
                role=Role(r.role),
                created_at=r.created_at,
            ),
            lambda member: member.user.id,
        )
    return MemberPage(items=items, next_cursor=cursor)
