"""How strongly each driver isolates a workload from its machine, as the control plane rates it.

The rating is the control plane's, never the agent's (DESIGN.md, "Agents and drivers"): an
agent only says which drivers it has. Weak isolation (a process on the host's kernel) is for
the machine owner's own workloads; everyone else needs a strong one (a VM). `sim` runs
nothing, so it exposes nothing and counts as strong. A machine whose Docker engine has a Kata
runtime reports the `docker-kata` driver too: the agent says which runtimes it found, the rating
of each driver is this table's.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Isolation(StrEnum):
    weak = "weak"
    strong = "strong"


DRIVER_ISOLATION: dict[str, Isolation] = {
    "sim": Isolation.strong,
    "process": Isolation.weak,
    "docker": Isolation.weak,
    # the docker driver with the machine's Kata runtime: each container in its own VM
    "docker-kata": Isolation.strong,
    "libvirt": Isolation.strong,
    "macos-vz": Isolation.strong,
}
"""An unknown driver counts as weak: nothing is trusted that the catalog does not rate."""


def has_strong_driver(drivers: Iterable[str]) -> bool:
    return any(DRIVER_ISOLATION.get(d) is Isolation.strong for d in drivers)
