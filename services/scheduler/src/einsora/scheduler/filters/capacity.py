"""Filter 6, capacity (now): has the machine room for the workload now? What it would give is
`capacity.fit`; the choice among machines with room is `score.py`'s."""

from __future__ import annotations

from einsora.scheduler import reasons
from einsora.scheduler.capacity import Demand, Grant, fit
from einsora.scheduler.model import Machine

QUESTION = "Has it room for the workload now?"


def grant(machine: Machine, demand: Demand) -> Grant | None:
    """What the machine gives `demand` now (None: no room)."""
    return fit(machine, demand)


def refusal(label: str, machine: Machine, demand: Demand, free_devices: int) -> str:
    """`m-1 (l40s-48gb): none free there (4 of 4 in use)`, and the like."""
    if demand.gpu:
        total = len(machine.lent_gpus_by_class.get(demand.class_name, []))
        return reasons.step_gpus_busy(label, "there", free_devices, total, demand.count)
    what = f"{demand.cpus:g} cores and {demand.memory_mib / 1024:g} GiB"
    return reasons.step_cpu_busy(label, "there", what)
