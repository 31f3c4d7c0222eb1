"""Sharing a machine: its sharing level, what its owner lends, and the owner's reclaim.

A machine's owner (its owner tenant's admins, or the operator) sets them. The routes put the
changed `Enrolment` to the `enrolments` bucket after each commit. The scheduler decides from it
(guests count only while the sharing is not private), never from this module. Who may see a
machine is `machine_visibility.py`, and invitations are `machine_invitations.py`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Conflict, Forbidden, NotFound, field_error
from einsora.api.schemas.machines import (
    LendUpdate,
    SharingUpdate,
)
from einsora.api.services import machines
from einsora.api.services.machine_visibility import may_manage, may_see
from einsora.api.store import Store
from einsora.common.schemas import Enrolment, Inventory, Lend, utcnow

_m = m.machines.c
_i = m.machine_invitations.c
_guest = m.tenants.alias("guest")
_guest_user = m.users.alias("guest_user")
_owner = m.tenants.alias("owner")


async def managed(
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


def live(enrolment: Enrolment) -> None:
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
        enrolment = await managed(conn, principal, machine_id, community_pool=community_pool)
        live(enrolment)
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
        enrolment = await managed(conn, principal, machine_id, community_pool=community_pool)
        live(enrolment)
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
