"""Which driver runs a workload on a machine, and the words that say why (issue 21).

A machine's agent reports the drivers it can run workloads with (`Inventory.drivers`: an engine
that is not reachable is not listed) and what it found of each engine (`Inventory.engines`:
KVM or software emulation, Docker's runtimes). What a workload needs comes from its kind and
spec: a `vm` runs in a VM (`libvirt`); a notebook or endpoint whose spec names a container
`image` runs in a container (`docker`, or `docker-kata`, each container in its own VM); any
other runs as a local process (`process`). `spec.driver` may name one of those itself. `sim`
stands in for all of them, and runs nothing.

Which of those a workload may get is the trust matrix's (trust.py): weak isolation for the
machine owner's own workloads only. Strength is the catalog's rating
(`einsora.common.isolation`), never the agent's. Among the drivers that fit, the owner's
workloads take the first of the order below (the lighter one); guests take a strong one.

Which drivers a machine may claim is the operator's word, not the machine's (issue 34, N9):
`sim` counts only in a cell that allows sim machines (`sim_machines`, `EINSORA_SIM_MACHINES`).
Elsewhere a machine's `sim` is ignored, as if it had not reported it, and every refusal there
says so; where it counts, every placement with it says that nothing runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from einsora.common import isolation
from einsora.common.isolation import DRIVER_ISOLATION, Isolation, claimable
from einsora.common.schemas import Inventory, Virtualization, WorkloadKind

SIM = isolation.SIM
PROCESS = "process"
SIM_SETTING = "EINSORA_SIM_MACHINES"

_VM = ("libvirt",)
_CONTAINER = ("docker", "docker-kata")
_PROCESS = (PROCESS,)


class _HasSpec(Protocol):
    @property
    def kind(self) -> WorkloadKind: ...
    @property
    def spec(self) -> dict[str, Any]: ...


Needs = tuple[WorkloadKind, bool, str | None]
"""What decides a workload's driver: its kind, whether it names an image, the driver it asks."""


def needs_key(workload: _HasSpec) -> Needs:
    """The part of a workload that `choose` reads, as a key (for caches of who may run where)."""
    image = workload.spec.get("image")
    return workload.kind, isinstance(image, str) and bool(image), _asked(workload.spec)


@dataclass(frozen=True)
class Choice:
    """The driver a workload runs with on one machine, and why, for the placement note."""

    driver: str
    why: str


def _fits(kind: WorkloadKind, spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The drivers that can run the workload, lightest first."""
    if kind is WorkloadKind.vm:
        return _VM
    image = spec.get("image")
    return _CONTAINER if isinstance(image, str) and image else _PROCESS


def _needs(kind: WorkloadKind, spec: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """What the workload is, in words, and the drivers that can run it (lightest first)."""
    fits = _fits(kind, spec)
    if fits is _VM:
        return "a vm", fits
    if fits is _CONTAINER:
        return "a container image", fits
    article = "an" if kind.value[0] in "aeiou" else "a"
    return f"{article} {kind.value} without a container image", fits


def _asked(spec: Mapping[str, Any]) -> str | None:
    asked = spec.get("driver")
    return asked if isinstance(asked, str) and asked else None


def strong(driver: str) -> bool:
    return DRIVER_ISOLATION.get(driver) is Isolation.strong


def claimed(inventory: Inventory, *, sim_machines: bool) -> list[str]:
    """The drivers of `inventory` the control plane believes (`sim` only where allowed)."""
    return claimable(inventory.drivers, sim_machines=sim_machines)


def ignores_sim(inventory: Inventory, *, sim_machines: bool) -> bool:
    """Whether the machine reports `sim` in a cell that does not allow sim machines."""
    return not sim_machines and SIM in inventory.drivers


def can_run(
    inventory: Inventory,
    kind: WorkloadKind,
    spec: Mapping[str, Any],
    *,
    owner: bool,
    sim_machines: bool,
) -> bool:
    """Whether `choose` finds a driver (the trust filter's question, asked for every machine
    a placement considers: no words made, nothing allocated)."""
    have = claimed(inventory, sim_machines=sim_machines)
    if SIM in have:
        return True
    asked = _asked(spec)
    return any(
        d in have and (owner or strong(d)) and (asked is None or d == asked)
        for d in _fits(kind, spec)
    )


def choose(
    inventory: Inventory,
    kind: WorkloadKind,
    spec: Mapping[str, Any],
    *,
    owner: bool,
    sim_machines: bool,
) -> Choice | None:
    """The driver `inventory`'s machine runs the workload with, or None when none may."""
    have = claimed(inventory, sim_machines=sim_machines)
    if SIM in have:
        return Choice(SIM, "nothing runs (a simulated machine)")
    what, fits = _needs(kind, spec)
    asked = _asked(spec)
    for driver in fits:
        if asked is not None and driver != asked:
            continue
        if driver in have and (owner or strong(driver)):
            return Choice(driver, _why(driver, what, inventory))
    return None


def refusal(
    inventory: Inventory,
    kind: WorkloadKind,
    spec: Mapping[str, Any],
    *,
    owner: bool,
    sim_machines: bool,
) -> str:
    """Why no driver of the machine may run the workload (after the machine's id and ": ")."""
    return _refusal(inventory, kind, spec, sim_machines) + sim_ignored(
        inventory, sim_machines=sim_machines
    )


def _refusal(
    inventory: Inventory, kind: WorkloadKind, spec: Mapping[str, Any], sim_machines: bool
) -> str:
    what, fits = _needs(kind, spec)
    asked = _asked(spec)
    believed = claimed(inventory, sim_machines=sim_machines)
    have = ", ".join(sorted(believed)) or "no driver"
    if asked is not None and asked not in fits:
        options = " or ".join(fits)
        return f"spec.driver {asked} cannot run {what} (it runs with {options})"
    wanted = [d for d in fits if asked is None or d == asked]
    present = [d for d in wanted if d in believed]
    if not present:
        return f"no driver here runs {what} (it needs {' or '.join(wanted)}; it has {have})"
    weak = ", ".join(d for d in present if not strong(d))
    return f"only weak isolation ({weak}) for {what}; guests need strong"


def sim_ignored(inventory: Inventory, *, sim_machines: bool) -> str:
    """What a refusal adds when the machine's `sim` was ignored ("" when it was not)."""
    if not ignores_sim(inventory, sim_machines=sim_machines):
        return ""
    return f"; its sim driver is ignored: this cell does not allow sim machines ({SIM_SETTING})"


def _why(driver: str, what: str, inventory: Inventory) -> str:
    if driver == "libvirt":
        virtualization = next(
            (e.virtualization for e in inventory.engines if e.name == "libvirt"), None
        )
        if virtualization is Virtualization.kvm:
            how = "KVM"
        elif virtualization is Virtualization.emulated:
            how = f"software emulation ({inventory.machine_id} has no KVM, so it runs slowly)"
        else:
            how = "virtualization not reported"
        return f"{what} runs in a VM (strong isolation), {how}"
    if driver == "docker-kata":
        return f"{what} runs in a container in its own VM (Kata: strong isolation)"
    if driver == "docker":
        return f"{what} runs in a container (weak isolation: the host's kernel; your own machine)"
    return f"{what} runs as a local process (weak isolation; your own machine)"


def note(choice: Choice) -> str:
    """The placement note's words for `choice`."""
    return f"driver {choice.driver}: {choice.why}"
