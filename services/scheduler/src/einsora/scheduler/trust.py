"""The trust filter: which tenants' workloads a machine may take (issue 9, hole 3).

Weak isolation (the `process` driver: a process on the host) is for the machine owner's own
workloads only. Until machines are enrolled with owners (issue 14) and sharing levels
(issue 15), every machine belongs to one tenant, the operator's (`Settings.machine_owner_tenant`;
Solo sets it to the owner's tenant). So a machine whose drivers are all weak takes only that
tenant's workloads; another tenant's launch stays queued with that reason.
"""

from __future__ import annotations

from einsora.common.isolation import has_strong_driver
from einsora.scheduler.model import Machine


def may_run(machine: Machine, tenant_id: str, owner_tenant: str | None) -> bool:
    """Whether `machine` may take a workload of `tenant_id`."""
    return tenant_id == owner_tenant or has_strong_driver(machine.inventory.drivers)


def refusal(machine_ids: list[str], owner_tenant: str | None) -> str:
    """The timeline's sentence when only trust keeps a workload off the machines that fit it."""
    where = machine_ids[0] if len(machine_ids) == 1 else f"{len(machine_ids)} machines"
    whose = "its owner's tenant" if owner_tenant else "no tenant (no machine owner is set)"
    return (
        f"{where} could hold it, but offers only weak isolation (a process on the host), which "
        f"runs {whose} workloads only; it waits for a machine with strong isolation (a VM)"
    )
