"""Machine invitations: a machine's owner invites other tenants, or single users; a guest
tenant's admin, or the guest user, accepts.

An accepted, unrevoked invitation makes the tenant one of the machine's `guests` (the user one
of its `guest_users`: their workloads, in whatever tenant) in its `Enrolment`, which the routes
put to the `enrolments` bucket after each commit.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Forbidden, NotFound, field_error
from einsora.api.pagination import keyset_page
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.machines import (
    MachineInvitationCreate,
    MachineInvitationOut,
    MachineInvitationPage,
)
from einsora.api.services import machines
from einsora.api.services.machine_sharing import live, managed
from einsora.api.services.machine_visibility import may_manage, may_see
from einsora.api.store import Store
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import Enrolment, utcnow

_m = m.machines.c
_i = m.machine_invitations.c
_guest = m.tenants.alias("guest")
_guest_user = m.users.alias("guest_user")
_owner = m.tenants.alias("owner")


def _select() -> sa.Select[tuple[Any, ...]]:
    return (
        sa.select(
            _i.id,
            _i.machine_id,
            _i.tenant_id,
            _guest.c.name.label("tenant_name"),
            _i.user_id,
            _guest_user.c.username,
            _owner.c.name.label("owner_tenant_name"),
            _i.created_at,
            _i.accepted_at,
            _i.revoked_at,
        )
        .outerjoin(_guest, _guest.c.id == _i.tenant_id)
        .outerjoin(_guest_user, _guest_user.c.id == _i.user_id)
        .join(m.machines, _m.id == _i.machine_id)
        .join(_owner, _owner.c.id == _m.owner_tenant_id)
    )


def _out(row: Any) -> MachineInvitationOut:
    return MachineInvitationOut.model_validate(dict(row._mapping))


async def _tenant_named(conn: AsyncConnection, name_or_id: str) -> str:
    """The id of the tenant with this name or id, or a 422 naming `tenant`."""
    column = m.tenants.c.id if is_id(name_or_id, "tenant") else m.tenants.c.name
    found = await conn.scalar(sa.select(m.tenants.c.id).where(column == name_or_id))
    if found is None:
        raise field_error("tenant", f"no tenant {name_or_id!r}")
    return str(found)


async def _user_named(conn: AsyncConnection, username: str) -> str:
    """The id of the user with this username, or a 422 naming `user`."""
    found = await conn.scalar(sa.select(m.users.c.id).where(m.users.c.username == username))
    if found is None:
        raise field_error("user", f"no user {username!r}")
    return str(found)


@dataclasses.dataclass(frozen=True)
class _Guest:
    """Whom an invitation names: a tenant or a user (one of the two ids is set)."""

    tenant_id: str | None = None
    user_id: str | None = None

    @property
    def named(self) -> sa.ColumnElement[bool]:
        if self.tenant_id is not None:
            return _i.tenant_id == self.tenant_id
        return _i.user_id == self.user_id


async def _guest_of(
    conn: AsyncConnection, body: MachineInvitationCreate, enrolment: Enrolment
) -> _Guest:
    if (body.tenant is None) == (body.user is None):
        raise field_error("tenant", "give exactly one of tenant and user")
    if body.tenant is not None:
        tenant_id = await _tenant_named(conn, body.tenant)
        if tenant_id == enrolment.owner_tenant_id:
            raise field_error("tenant", "is the machine's owner tenant, which uses it already")
        return _Guest(tenant_id=tenant_id)
    assert body.user is not None
    return _Guest(user_id=await _user_named(conn, body.user))


async def _live_invitation(
    conn: AsyncConnection, machine_id: str, guest: _Guest
) -> MachineInvitationOut | None:
    row = (
        await conn.execute(
            _select().where(_i.machine_id == machine_id, guest.named, _i.revoked_at.is_(None))
        )
    ).first()
    return None if row is None else _out(row)


async def invite(
    store: Store,
    principal: Principal,
    machine_id: str,
    body: MachineInvitationCreate,
    *,
    community_pool: bool,
    now: datetime | None = None,
) -> tuple[MachineInvitationOut, bool]:
    """Invite a tenant or a user to use the machine: the invitation, and whether it is new
    (False: the guest's live invitation to it, made before)."""
    guest = None
    try:
        async with store.write() as conn:
            enrolment = await managed(conn, principal, machine_id, community_pool=community_pool)
            live(enrolment)
            guest = await _guest_of(conn, body, enrolment)
            existing = await _live_invitation(conn, machine_id, guest)
            if existing is not None:
                return existing, False
            invitation_id = new_id("machine_invitation")
            await conn.execute(
                sa.insert(m.machine_invitations).values(
                    id=invitation_id,
                    machine_id=machine_id,
                    tenant_id=guest.tenant_id,
                    user_id=guest.user_id,
                    invited_by=principal.user_id,
                    created_at=now or utcnow(),
                )
            )
            made = (await conn.execute(_select().where(_i.id == invitation_id))).one()
            return _out(made), True
    except IntegrityError:
        if guest is None:
            raise
        # The same guest invited by a concurrent request (the live index refused a second).
        async with store.read() as conn:
            existing = await _live_invitation(conn, machine_id, guest)
        if existing is None:
            raise
        return existing, False


async def list_for_machine(
    store: Store, principal: Principal, machine_id: str, query: PageQuery, *, community_pool: bool
) -> MachineInvitationPage:
    """Every invitation to the machine (revoked ones too), for whoever shares it."""
    async with store.read() as conn:
        enrolment = await machines.enrolment_of(conn, machine_id)
        if enrolment is None or not may_see(enrolment, principal, community_pool=community_pool):
            raise NotFound(f"no machine {machine_id!r}")
        if not may_manage(enrolment, principal):
            raise Forbidden("only an admin of the machine's owner tenant sees its invitations")
        stmt = _select().where(_i.machine_id == machine_id)
        items, cursor = await keyset_page(conn, stmt, _i.id, query, _out, lambda i: i.id)
    return MachineInvitationPage(items=items, next_cursor=cursor)


async def revoke(
    store: Store,
    principal: Principal,
    machine_id: str,
    invitation_id: str,
    *,
    community_pool: bool,
    now: datetime | None = None,
) -> Enrolment:
    """Revoke an invitation (again: nothing changes), committed: the machine's enrolment now,
    without that guest."""
    async with store.write() as conn:
        await managed(conn, principal, machine_id, community_pool=community_pool)
        found = None
        if is_id(invitation_id, "machine_invitation"):
            found = await conn.scalar(
                sa.select(_i.id).where(_i.id == invitation_id, _i.machine_id == machine_id)
            )
        if found is None:
            raise NotFound(f"no invitation {invitation_id!r} to machine {machine_id}")
        await conn.execute(
            sa.update(m.machine_invitations)
            .where(_i.id == invitation_id, _i.revoked_at.is_(None))
            .values(revoked_at=now or utcnow())
        )
        enrolment = await machines.enrolment_of(conn, machine_id)
    assert enrolment is not None  # locked above
    return enrolment


async def list_mine(store: Store, principal: Principal, query: PageQuery) -> MachineInvitationPage:
    """The invitations to the caller's tenant or to the caller, open and accepted, to machines
    not revoked."""
    stmt = _select().where(
        sa.or_(_i.tenant_id == principal.tenant_id, _i.user_id == principal.user_id),
        _i.revoked_at.is_(None),
        _m.revoked_at.is_(None),
    )
    async with store.read() as conn:
        items, cursor = await keyset_page(conn, stmt, _i.id, query, _out, lambda i: i.id)
    return MachineInvitationPage(items=items, next_cursor=cursor)


async def accept(
    store: Store, principal: Principal, invitation_id: str, *, now: datetime | None = None
) -> tuple[MachineInvitationOut, Enrolment]:
    """The invited user, or an admin of the invited tenant, accepts (again: nothing changes),
    committed: the invitation and the machine's enrolment now, the guest among its guests."""
    if not is_id(invitation_id, "machine_invitation"):
        raise NotFound(f"no invitation {invitation_id!r}")
    mine = sa.and_(
        _i.id == invitation_id,
        sa.or_(_i.tenant_id == principal.tenant_id, _i.user_id == principal.user_id),
        _i.revoked_at.is_(None),
    )
    async with store.write() as conn:
        found = (await conn.execute(sa.select(_i.machine_id, _i.user_id).where(mine))).first()
        if found is None:
            raise NotFound(f"no invitation {invitation_id!r}")
        machine_id = found.machine_id
        if found.user_id is None and not principal.is_admin:
            raise Forbidden(f"only an admin of {principal.tenant_name} accepts an invitation")
        locked = await conn.execute(sa.select(_m.id).where(_m.id == machine_id).with_for_update())
        locked.one()
        enrolment = await machines.enrolment_of(conn, machine_id)
        assert enrolment is not None  # locked above
        live(enrolment)
        await conn.execute(
            sa.update(m.machine_invitations)
            .where(mine, _i.accepted_at.is_(None))
            .values(accepted_at=now or utcnow(), accepted_by=principal.user_id)
        )
        row = (await conn.execute(_select().where(_i.id == invitation_id))).one()
        enrolment = await machines.enrolment_of(conn, machine_id)
    assert enrolment is not None
    return _out(row), enrolment
