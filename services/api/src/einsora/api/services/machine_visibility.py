"""Who may see which machine, and what they are shown of it (tenant isolation).

A machine is visible to its owner's tenant, to the operator, to its guests (tenants and users)
while it is shared, and to everyone while it is `community` on an instance that runs a community
pool (elsewhere `community` counts as invite-only, as the scheduler counts it). Anyone else is
answered 404, as if it did not exist. A tenant that can see a machine but not manage it is
answered 403 (`may_manage`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.schemas.catalog import MachineOut
from einsora.api.services import machines
from einsora.api.store import Store
from einsora.api.views.machines import MachineRecord
from einsora.common.schemas import Enrolment, SharingLevel
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
