"""The trust matrix: who may use a machine, and with which isolation (issues 9, 15).

A workload's trust level on a machine comes from the machine's enrolment and the workload's
tenant and user: **owner** (the machine's owner's tenant), **invited** (a tenant, or the user
who launched it, whose invitation the owner made and the guest accepted, while the machine is
not private) or **community** (any tenant, on
a machine shared with the community of an instance whose operator runs a community pool).
Anyone else may not use the machine at all. Weak isolation (the `process` driver: a process on
the host's kernel) runs the owner's own workloads only; guests, invited or community, need a
strong one (a VM). A driver's isolation is the control plane's rating (`einsora.common.
isolation`), never the agent's. Given the workload's kind and spec, the machine must also have a
driver that runs it at the isolation its trust level allows (`drivers.choose`). A machine
enrolled without an owner (none are, since issue 14, but a store from before may hold one)
belongs to the cell's owner (`machine_owner_tenant`).

The drivers a machine may claim are the operator's word (issue 34, N9): `sim`, which runs
nothing, counts only in a cell that allows sim machines (`sim_machines`); elsewhere it is
ignored for every tenant, the owner's included, and never counts as strong isolation.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from einsora.common.isolation import DRIVER_ISOLATION, Isolation, has_strong_driver
from einsora.common.schemas import SharingLevel, WorkloadKind
from einsora.scheduler import drivers
from einsora.scheduler.model import Machine
from einsora.scheduler.reasons import OWNER_LENDS


class Trust(StrEnum):
    owner = "owner"
    invited = "invited"
    community = "community"


def trust_level(
    machine: Machine,
    tenant_id: str,
    cell_owner: str | None,
    community_pool: bool,
    user_id: str | None = None,
) -> Trust | None:
    """The trust level on `machine` of a workload of `tenant_id` launched by `user_id`; None:
    it may not use the machine."""
    if tenant_id == (machine.owner_tenant or cell_owner):
        return Trust.owner
    if machine.sharing is not SharingLevel.private and (
        tenant_id in machine.guests or (user_id is not None and user_id in machine.guest_users)
    ):
        return Trust.invited
    if machine.sharing is SharingLevel.community and community_pool:
        return Trust.community
    return None


def may_run(
    machine: Machine,
    tenant_id: str,
    cell_owner: str | None,
    community_pool: bool,
    user_id: str | None = None,
    *,
    sim_machines: bool,
    kind: WorkloadKind | None = None,
    spec: Mapping[str, Any] | None = None,
) -> bool:
    """Whether `machine` may take a workload of `tenant_id` by `user_id` (the matrix above);
    with its `kind` (and `spec`), also whether one of its drivers runs it at that trust.
    `sim_machines`: whether the cell allows sim machines."""
    level = trust_level(machine, tenant_id, cell_owner, community_pool, user_id)
    if level is None:
        return False
    owner = level is Trust.owner
    # While its owner reclaims it, a machine takes no guest (ADR-0017).
    if not owner and machine.reclaimed_at is not None:
        return False
    if kind is not None:
        return drivers.can_run(
            machine.inventory, kind, spec or {}, owner=owner, sim_machines=sim_machines
        )
    have = drivers.claimed(machine.inventory, sim_machines=sim_machines)
    return owner or has_strong_driver(have) or drivers.SIM in have


def why_not(
    machine: Machine,
    tenant_id: str,
    cell_owner: str | None,
    community_pool: bool,
    user_id: str | None = None,
    *,
    sim_machines: bool,
    kind: WorkloadKind | None = None,
    spec: Mapping[str, Any] | None = None,
) -> str:
    """Why `machine` may not take the workload, for its placement note."""
    level = trust_level(machine, tenant_id, cell_owner, community_pool, user_id)
    if level is None:
        if machine.sharing is SharingLevel.community and not community_pool:
            return f"{machine.machine_id}: shared with a community pool this instance does not run"
        return f"{machine.machine_id}: not shared with your tenant or you"
    if level is not Trust.owner and machine.reclaimed_at is not None:
        return f"{machine.machine_id}: reclaimed by its owner"
    if kind is not None:
        why = drivers.refusal(
            machine.inventory,
            kind,
            spec or {},
            owner=level is Trust.owner,
            sim_machines=sim_machines,
        )
        return f"{machine.machine_id}: {why}"
    have = drivers.claimed(machine.inventory, sim_machines=sim_machines)
    weak = ", ".join(sorted(d for d in have if DRIVER_ISOLATION.get(d) is not Isolation.strong))
    ignored = drivers.sim_ignored(machine.inventory, sim_machines=sim_machines)
    return (
        f"{machine.machine_id}: only weak isolation ({weak or 'no driver'}); guests need strong"
        f"{ignored}"
    )


def refusal(reasons: list[str]) -> str:
    """The timeline's sentence when only trust, or what owners lend, keeps a workload off the
    machines that would hold it (each reason names a machine: `why_not`, or
    `reasons.lend_too_small`, whose words contain `OWNER_LENDS`)."""
    shown = "; ".join(reasons[:3])
    more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    lend = [OWNER_LENDS in r for r in reasons]
    if lend and all(lend):
        return (
            f"machines that could hold it are not lent to Einsora whole: {shown}{more}; it "
            "waits until an owner lends more, or launch it with a smaller class or count"
        )
    if any(lend):
        return (
            f"machines that could hold it may not take it: {shown}{more}; it waits for one "
            "that may (a machine of your own, or one shared with you that isolates guests "
            "strongly), or for an owner to lend more"
        )
    return (
        f"machines that could hold it may not take it: {shown}{more}; it waits for one that "
        "may (a machine of your own, or one shared with you that isolates guests strongly)"
    )
