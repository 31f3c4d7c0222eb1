"""How strongly each driver isolates a workload from its machine, as the control plane rates it.

The rating is the control plane's, never the agent's (DESIGN.md, "Agents and drivers"): an
agent only says which drivers it has. Weak isolation (a process on the host's kernel) is for
the machine owner's own workloads; everyone else needs a strong one (a VM). A machine whose
Docker engine has a Kata runtime reports the `docker-kata` driver too: the agent says which
runtimes it found, the rating of each driver is this table's.

`sim` runs nothing: it is neither, but simulated. Which drivers a machine may claim is the
operator's word (issue 34, N9): a simulated one only in a cell that allows sim machines
(`EINSORA_SIM_MACHINES`: tests, benchmarks, Solo's own sim agent), and never counted as strong
isolation, so a guest's workload is never "run" on a machine that only says it ran it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Isolation(StrEnum):
    weak = "weak"
    strong = "strong"
    simulated = "simulated"
    """Nothing runs: only where the operator allows sim machines."""


SIM = "sim"

DRIVER_ISOLATION: dict[str, Isolation] = {
    SIM: Isolation.simulated,
    "process": Isolation.weak,
    "docker": Isolation.weak,
    # the docker driver with the machine's Kata runtime: each container in its own VM
    "docker-kata": Isolation.strong,
    "libvirt": Isolation.strong,
    "macos-vz": Isolation.strong,
}
"""An unknown driver counts as weak: nothing is trusted that the catalog does not rate."""


def simulated(driver: str) -> bool:
    return DRIVER_ISOLATION.get(driver) is Isolation.simulated


def claimable(drivers: Iterable[str], *, sim_machines: bool) -> list[str]:
    """The drivers of those a machine reports that the control plane believes it has: all of
    them, but a simulated one only where the operator allows sim machines."""
    return [d for d in drivers if sim_machines or not simulated(d)]


def has_strong_driver(drivers: Iterable[str]) -> bool:
    return any(DRIVER_ISOLATION.get(d) is Isolation.strong for d in drivers)
