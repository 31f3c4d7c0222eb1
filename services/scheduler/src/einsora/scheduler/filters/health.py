"""Filter 2, GPU health: are enough of the machine's devices of the class healthy?

A quarantined device serves no class (`Catalog.devices_by_class`), so a machine whose devices of
a class are quarantined offers fewer of it, or none; this filter says so by name rather than
leaving the machine to look small.
"""

from __future__ import annotations

from einsora.common.catalog import Catalog
from einsora.common.schemas import GpuHealth
from einsora.scheduler.capacity import Demand
from einsora.scheduler.model import Machine

QUESTION = "Are enough of its devices of the class healthy?"


def passes(machine: Machine, demand: Demand) -> bool:
    if not demand.gpu:
        return True
    return len(machine.gpus_by_class.get(demand.class_name, [])) >= demand.count or not any(
        g.health is not GpuHealth.ok for g in machine.inventory.gpus
    )


def refusal(machine: Machine, demand: Demand, catalog: Catalog) -> str | None:
    """`m-1: 2 of its 4 l40s-48gb quarantined`, when quarantine is why it falls short."""
    if passes(machine, demand):
        return None
    healed = machine.inventory.model_copy(
        update={
            "gpus": [g.model_copy(update={"health": GpuHealth.ok}) for g in machine.inventory.gpus]
        }
    )
    every = catalog.devices_by_class(healed).get(demand.class_name, [])
    if len(every) < demand.count:
        return None  # it would fall short healthy too: not health's refusal
    sick = len(every) - len(machine.gpus_by_class.get(demand.class_name, []))
    return f"{machine.machine_id}: {sick} of its {len(every)} {demand.class_name} quarantined"
