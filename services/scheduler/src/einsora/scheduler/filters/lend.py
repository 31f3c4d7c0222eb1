"""Filter 3, class and lend: does the machine offer the class (and the endpoint runtime), and
does its owner lend enough of it to hold the workload, emptied?"""

from __future__ import annotations

from einsora.scheduler import reasons
from einsora.scheduler.capacity import Demand, holds_emptied, serves
from einsora.scheduler.model import Machine

QUESTION = "Does it offer the class and runtime, and does its owner lend enough of it?"


def passes(machine: Machine, demand: Demand) -> bool:
    return holds_emptied(machine, demand)


def refusal(machine: Machine, demand: Demand) -> str:
    if not serves(machine, demand):
        return f"{machine.machine_id}: does not serve the {demand.runtime} runtime"
    short = reasons.lend_too_small(machine, demand)
    if short is not None:
        return short
    if demand.gpu:
        have = len(machine.gpus_by_class.get(demand.class_name, []))
        return f"{machine.machine_id}: has {have} {demand.class_name}, not {demand.count}"
    memory_gib = machine.inventory.memory_mib // 1024
    return f"{machine.machine_id}: has {machine.inventory.cpus} cores and {memory_gib} GiB in all"
