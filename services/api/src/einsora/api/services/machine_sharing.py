"""Sharing machines: the sharing level, machine invitations, and who may see which machine.

A machine's owner (its owner tenant's admins, or the operator) sets its sharing level and
invites other tenants, or single users; a guest tenant's admin, or the guest user, accepts. An
accepted, unrevoked invitation makes the tenant one of the machine's `guests` (the user one of
its `guest_users`: their workloads, in whatever tenant) in its `Enrolment`, which the routes
put to the `enrolments` bucket after each commit; the scheduler decides from it (guests count
only while the sharing is not private), never from this module.

Tenant isolation: a machine is visible to its owner's tenant, to the operator, to its guests
(tenants and users) while it is shared, and to everyone while it is `community` on an
instance that runs a community pool (elsewhere `community` counts as invite-only, as the
scheduler counts it); anyone else is answered 404, as if it did not exist. A tenant that can
see a machine but not manage it is answered 403.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Conflict, Forbidden, NotFound, field_error
from einsora.api.machines import MachineRecord
from einsora.api.pagination import keyset_page
from einsora.api.schemas.catalog import MachineOut
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.machines import (
    LendUpdate,
    MachineInvitationCreate,
    MachineInvitationOut,
    MachineInvitationPage,
    SharingUpdate,
)
from einsora.api.services import machines
from einsora.api.store import Store
from einsora.common.ids import is_id, new_id
from einsora.common.schemas import Enrolment, Inventory, Lend, SharingLevel, utcnow
from einsora.common.schemas.workload import TERMINAL_STATES

_m = m.machines.c
_i = m.machine_invitations.c
_guest = m.tenants.alias("guest")
_guest_user = m.users.alias("guest_user")
_owner = m.tenants.alias("owner")


def may_see(enrolment: Enrolment, principal: Principal, *, community_pool: bool) -> bool:
    """Whether the caller may know the machine exists (see the module). `community_pool`: this
    instance runs one (the settings'); where it does not, `community` counts as invite-only,
    as the scheduler counts it."""
    if principal.is_operator or enrolment.owner_tenant_id == principal.tenant_id:
        return True
    if enrolment.revoked or enrolment.sharing is SharingLevel.private:
        return False
    if community_pool and enrolment.sharing is SharingLevel.community:
        return True
    return principal.tenant_id in enrolment.guests or principal.user_id in enrolment.guest_users


def may_manage(enrolment: Enrolment, principal: Principal) -> bool:
    """Whether the caller shares the machine: an admin of its owner tenant, or the operator."""
    return principal.is_operator or (
        principal.is_admin and enrolment.owner_tenant_id == principal.tenant_id
    )


def visible(
    records: Iterable[MachineRecord], principal: Principal, *, community_pool: bool
) -> list[MachineRecord]:
    """The machines the caller may see; a machine that is not enrolled, only the operator."""
    if principal.is_operator:
        return list(records)
    return [
        r
        for r in records
        if r.enrolment is not None
        and may_see(r.enrolment, principal, community_pool=community_pool)
    ]


async def owner_names(store: Store, records: Iterable[MachineRecord]) -> dict[str, str]:
    """The names of these machines' owner tenants, by id, in one query."""
    ids = {r.enrolment.owner_tenant_id for r in records if r.enrolment is not None}
    if not ids:
        return {}
    stmt = sa.select(m.tenants.c.id, m.tenants.c.name).where(m.tenants.c.id.in_(sorted(ids)))
    async with store.read() as conn:
        return {tenant_id: name for tenant_id, name in (await conn.execute(stmt)).all()}


def machine_out(
    record: MachineRecord, viewer: Principal, owner_name: str | None, workloads: int
) -> MachineOut:
    """A machine as `/v1/machines` shows it to `viewer` (whose workloads it counts)."""
    enrolment = record.enrolment
    return MachineOut(
        id=record.machine_id,
        region=record.region,
        inventory=record.inventory,
        enrolment=None
        if enrolment is None
        else machines.shown(enrolment, viewer, owner_name, record.inventory),
        heartbeat_at=record.heartbeat_at,
        workloads=workloads,
    )


async def shown_machine(
    store: Store, principal: Principal, enrolment: Enrolment, record: MachineRecord | None
) -> MachineOut:
    """`enrolment` (just committed) with what the view knows of the machine, as listed."""
    record = dataclasses.replace(record or MachineRecord(enrolment.machine_id), enrolment=enrolment)
    return await listed_machine(store, principal, record)


async def listed_machine(store: Store, principal: Principal, record: MachineRecord) -> MachineOut:
    """One machine the caller may see (`visible`), as `/v1/machines` lists it."""
    names = await owner_names(store, [record])
    count = (
        record.workload_count
        if principal.is_operator
        else await _own_count(store, principal, record.machine_id)
    )
    owner = None if record.enrolment is None else names.get(record.enrolment.owner_tenant_id)
    return machine_out(record, principal, owner, count)


async def _own_count(store: Store, principal: Principal, machine_id: str) -> int:
    """How many of the caller's tenant's workloads are placed on the machine, not removed (as
    `/v1/machines` counts them: another tenant's are not told)."""
    w = m.workloads.c
    stmt = sa.select(sa.func.count()).where(
        w.tenant_id == principal.tenant_id,
        w.placed_machine == machine_id,
        w.state.not_in([s.value for s in TERMINAL_STATES]),
    )
    async with store.read() as conn:
        return int(await conn.scalar(stmt) or 0)


async def _managed(
    conn: AsyncConnection, principal: Principal, machine_id: str, *, community_pool: bool
) -> Enrolment:
    """The machine, locked for this unit of work, if the caller shares it: 404 if they may not
    see it, 403 if they see it but do not own it."""
    # Changes to one machine's sharing go one at a time, so each reads the others' guests.
    locked = await conn.execute(sa.select(_m.id).where(_m.id == machine_id).with_for_update())
    enrolment = None if locked.first() is None else await machines.enrolment_of(conn, machine_id)
    if enrolment is None or not may_see(enrolment, principal, community_pool=community_pool):
        raise NotFound(f"no machine {machine_id!r}")
    if not may_manage(enrolment, principal):
        raise Forbidden("only an admin of the machine's owner tenant, or the operator, shares it")
    return enrolment


def _live(enrolment: Enrolment) -> None:
    if enrolment.revoked:
        raise Conflict(
            f"machine {enrolment.machine_id} was revoked; it is shared with nobody",
            code="machine_revoked",
        )


async def set_sharing(
    store: Store,
    principal: Principal,
    machine_id: str,
    body: SharingUpdate,
    *,
    community_pool: bool,
    inventory: Inventory | None = None,
) -> Enrolment:
    """Set the machine's sharing level, reclaim grace, guests' minimum runtime or lend (those
    given), committed: its enrolment now. `inventory`: the machine's latest, which a lend must
    fit (None: not reported yet, so the scheduler narrows to what it has)."""
    values: dict[str, Any] = {
        field: value
        for field, value in body.model_dump(exclude_none=True, mode="json").items()
        if field in ("sharing", "reclaim_grace_s", "guest_min_runtime_s")
    }
    lending = "lend" in body.model_fields_set
    if not values and not lending:
        raise field_error("sharing", "give sharing, reclaim_grace_s, guest_min_runtime_s or lend")
    if body.lend is not None and inventory is not None:
        lend_fits(body.lend, inventory)
    async with store.write() as conn:
        enrolment = await _managed(conn, principal, machine_id, community_pool=community_pool)
        _live(enrolment)
        if lending:
            values |= machines.lend_columns(merged_lend(enrolment.lend, body.lend))
        await conn.execute(sa.update(m.machines).where(_m.id == machine_id).values(**values))
        now = await machines.enrolment_of(conn, machine_id)
    assert now is not None  # locked above
    return now


def merged_lend(current: Lend | None, patch: LendUpdate | None) -> Lend | None:
    """`patch` merged into the current lend (a merge patch: null lends all of a resource
    again, a field left out is kept); None: all of the inventory."""
    if patch is None:
        return None
    fields = (current or Lend()).model_dump(include={"cpus", "memory_mib", "gpus"})
    for name in patch.model_fields_set:
        value = getattr(patch, name)
        # The same uuid twice lends it once.
        fields[name] = list(dict.fromkeys(value)) if name == "gpus" and value else value
    lend = Lend.model_validate(fields)
    return None if lend.everything else lend


def lend_fits(patch: LendUpdate, inventory: Inventory) -> None:
    """A 422 naming the field when the lend asks for more than the machine has, or a GPU it
    does not have."""
    if patch.cpus is not None and patch.cpus > inventory.cpus:
        raise field_error(
            "lend.cpus", f"the machine has {inventory.cpus} cores, not {patch.cpus:g}"
        )
    if patch.memory_mib is not None and patch.memory_mib > inventory.memory_mib:
        raise field_error(
            "lend.memory_mib",
            f"the machine has {inventory.memory_mib} MiB, not {patch.memory_mib}",
        )
    have = {g.uuid for g in inventory.gpus}
    unknown = [uuid for uuid in patch.gpus or [] if uuid not in have]
    if unknown:
        named = ", ".join(repr(u) for u in unknown[:3])
        raise field_error("lend.gpus", f"not a GPU of this machine: {named}")


async def set_reclaimed(
    store: Store,
    principal: Principal,
    machine_id: str,
    reclaimed: bool,
    *,
    community_pool: bool,
    now: datetime | None = None,
) -> Enrolment:
    """Reclaim the machine (`reclaimed`; again: it stays reclaimed from the first time) or
    release it (again, or never reclaimed: nothing changes), committed: its enrolment now.
    The scheduler preempts guests' workloads from it after the grace (ADR-0017)."""
    async with store.write() as conn:
        enrolment = await _managed(conn, principal, machine_id, community_pool=community_pool)
        _live(enrolment)
        if reclaimed and enrolment.reclaimed_at is None:
            change = sa.update(m.machines).values(reclaimed_at=now or utcnow())
        elif not reclaimed and enrolment.reclaimed_at is not None:
            change = sa.update(m.machines).values(reclaimed_at=None)
        else:
            return enrolment
        await conn.execute(change.where(_m.id == machine_id))
        after = await machines.enrolment_of(conn, machine_id)
    assert after is not None  # locked above
    return after


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
            enrolment = await _managed(conn, principal, machine_id, community_pool=community_pool)
            _live(enrolment)
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
        await _managed(conn, principal, machine_id, community_pool=community_pool)
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
        _live(enrolment)
        await conn.execute(
            sa.update(m.machine_invitations)
            .where(mine, _i.accepted_at.is_(None))
            .values(accepted_at=now or utcnow(), accepted_by=principal.user_id)
        )
        row = (await conn.execute(_select().where(_i.id == invitation_id))).one()
        enrolment = await machines.enrolment_of(conn, machine_id)
    assert enrolment is not None
    return _out(row), enrolment
