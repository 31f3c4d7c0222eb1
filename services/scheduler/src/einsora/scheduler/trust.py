"""The trust matrix: who may use a machine, and with which isolation (issues 9, 15).

A workload's trust level on a machine comes from the machine's enrolment and the workload's
tenant: **owner** (the machine's owner's tenant), **invited** (a tenant whose invitation the
owner made and it accepted, while the machine is not private) or **community** (any tenant, on
a machine shared with the community of an instance whose operator runs a community pool).
Anyone else may not use the machine at all. Weak isolation (the `process` driver: a process on
the host's kernel) runs the owner's own workloads only; guests, invited or community, need a
strong one (a VM). A driver's isolation is the control plane's rating (`einsora.common.
isolation`), never the agent's. A machine enrolled without an owner (none are, since issue 14,
but a store from before may hold one) belongs to the cell's owner (`machine_owner_tenant`).
"""

from __future__ import annotations

from enum import StrEnum

from einsora.common.isolation import DRIVER_ISOLATION, Isolation, has_strong_driver
from einsora.common.schemas import SharingLevel
from einsora.scheduler.model import Machine


class Trust(StrEnum):
    owner = "owner"
    invited = "invited"
    community = "community"


def trust_level(
    machine: Machine, tenant_id: str, cell_owner: str | None, community_pool: bool
) -> Trust | None:
    """The tenant's trust level on `machine`; None: it may not use the machine."""
    if tenant_id == (machine.owner_tenant or cell_owner):
        return Trust.owner
    if machine.sharing is not SharingLevel.private and tenant_id in machine.guests:
        return Trust.invited
    if machine.sharing is SharingLevel.community and community_pool:
        return Trust.community
    return None


def may_run(machine: Machine, tenant_id: str, cell_owner: str | None, community_pool: bool) -> bool:
    """Whether `machine` may take a workload of `tenant_id` (the matrix above)."""
    level = trust_level(machine, tenant_id, cell_owner, community_pool)
    if level is None:
        return False
    if level is Trust.owner:
        return True
    # While its owner reclaims it, a machine takes no guest (ADR-0017).
    return machine.reclaimed_at is None and has_strong_driver(machine.inventory.drivers)


def why_not(machine: Machine, tenant_id: str, cell_owner: str | None, community_pool: bool) -> str:
    """Why `machine` may not take the tenant's workload, for its placement note."""
    if trust_level(machine, tenant_id, cell_owner, community_pool) is None:
        if machine.sharing is SharingLevel.community and not community_pool:
            return f"{machine.machine_id}: shared with a community pool this instance does not run"
        return f"{machine.machine_id}: not shared with your tenant"
    if machine.reclaimed_at is not None:
        return f"{machine.machine_id}: reclaimed by its owner"
    drivers = machine.inventory.drivers
    weak = ", ".join(sorted(d for d in drivers if DRIVER_ISOLATION.get(d) is not Isolation.strong))
    return f"{machine.machine_id}: only weak isolation ({weak or 'no driver'}); guests need strong"


def refusal(reasons: list[str]) -> str:
    """The timeline's sentence when only trust keeps a workload off the machines that fit it."""
    shown = "; ".join(reasons[:3])
    more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    return (
        f"machines that could hold it may not take it: {shown}{more}; it waits for one that "
        "may (a machine of your own, or one shared with you that isolates guests strongly)"
    )
