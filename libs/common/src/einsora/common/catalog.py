"""The catalog of classes a workload can name: GPU classes and CPU classes.

A GPU class means whole devices of one model and memory; a CPU class means cores and memory.
`Catalog.offered_by` and `Catalog.devices_by_class` are the one match between a machine's
inventory and the catalog: the api's `/v1/classes` offers what they find and the scheduler
places on what they find, so a class is never offered where it cannot be placed. The agent's
`sim` driver builds fake GPUs from the classes. An operator extends the default catalog with a
JSON file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from einsora.common.errors import ConfigError
from einsora.common.schemas.machine import GpuHealth, Inventory


class Accelerator(StrEnum):
    """What kind of device a class is."""

    cpu = "cpu"
    nvidia = "nvidia"
    apple = "apple"


class MachineClass(BaseModel):
    """One catalog entry, e.g. `l40s-48gb` or `cpu-4c-16g`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    accelerator: Accelerator
    description: str = ""
    model: str | None = None
    """Device model as NVML names it, without the vendor (e.g. `L40S`); GPU classes only."""
    memory_gib: float = Field(gt=0)
    """Per device for GPU classes (unified memory for Apple); host memory for CPU classes."""
    cpus: float = Field(default=0, ge=0)
    """Cores, for CPU classes."""

    @property
    def memory_mib(self) -> int:
        return int(self.memory_gib * 1024)

    def matches_gpu(self, model: str, memory_mib: int) -> bool:
        """Whether a device of `model` with `memory_mib` can serve a workload of this class.

        NVML reports slightly less than the marketed size (an L40S shows 46,068 MiB for
        48 GB), so memory within 10% below the nominal size still matches. An NVIDIA class
        wants that size (a larger card is another class); an Apple Silicon class wants at
        least that much unified memory, since a workload takes the whole chip whatever its
        class: a 64 GB Mac serves apple-silicon-16gb, -32gb and -64gb, and a 36 GB one -32gb.
        """
        if self.accelerator is Accelerator.cpu or self.model is None:
            return False
        normalized = model.upper().removeprefix("NVIDIA ").strip()
        if normalized != self.model.upper():
            return False
        if self.accelerator is Accelerator.apple:
            return memory_mib >= 0.9 * self.memory_mib
        return 0.9 * self.memory_mib <= memory_mib <= 1.1 * self.memory_mib

    def fits_host(self, inventory: Inventory) -> bool:
        """Whether a machine has this CPU class's cores and memory in all (CPU classes only)."""
        return (
            self.accelerator is Accelerator.cpu
            and inventory.cpus >= self.cpus
            and inventory.memory_mib >= self.memory_mib
        )


def _gpu(name: str, model: str, gib: float, description: str) -> MachineClass:
    return MachineClass(
        name=name,
        accelerator=Accelerator.nvidia,
        model=model,
        memory_gib=gib,
        description=description,
    )


def _apple(gib: int) -> MachineClass:
    return MachineClass(
        name=f"apple-silicon-{gib}gb",
        accelerator=Accelerator.apple,
        model="Apple Silicon",
        memory_gib=gib,
        description=f"Apple Silicon with {gib} GB unified memory",
    )


def _cpu(cores: int, gib: int) -> MachineClass:
    return MachineClass(
        name=f"cpu-{cores}c-{gib}g",
        accelerator=Accelerator.cpu,
        cpus=cores,
        memory_gib=gib,
        description=f"{cores} CPU cores, {gib} GiB memory",
    )


DEFAULT_CLASSES: tuple[MachineClass, ...] = (
    _cpu(1, 2),
    _cpu(2, 4),
    _cpu(4, 16),
    _cpu(8, 32),
    _gpu("t4-16gb", "Tesla T4", 16, "NVIDIA T4, 16 GB"),
    _gpu("l4-24gb", "L4", 24, "NVIDIA L4, 24 GB"),
    _gpu("a10-24gb", "A10", 24, "NVIDIA A10, 24 GB"),
    _gpu("rtx4090-24gb", "GeForce RTX 4090", 24, "NVIDIA GeForce RTX 4090, 24 GB"),
    _gpu("l40s-48gb", "L40S", 48, "NVIDIA L40S, 48 GB"),
    _gpu("a100-40gb", "A100-SXM4-40GB", 40, "NVIDIA A100, 40 GB"),
    _gpu("a100-80gb", "A100-SXM4-80GB", 80, "NVIDIA A100, 80 GB"),
    _gpu("h100-80gb", "H100 80GB HBM3", 80, "NVIDIA H100, 80 GB"),
    _gpu("h200-141gb", "H200", 141, "NVIDIA H200, 141 GB"),
    _apple(16),
    _apple(32),
    _apple(64),
    _apple(128),
)


class Catalog:
    """The classes on offer, by name."""

    def __init__(self, classes: tuple[MachineClass, ...] | list[MachineClass] = DEFAULT_CLASSES):
        self._by_name = {c.name: c for c in classes}

    def get(self, name: str) -> MachineClass | None:
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[MachineClass]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def class_for_gpu(self, model: str, memory_mib: int) -> MachineClass | None:
        """The first GPU class a device can serve, or None when the catalog has none for it."""
        for c in self._by_name.values():
            if c.matches_gpu(model, memory_mib):
                return c
        return None

    def devices_by_class(self, inventory: Inventory) -> dict[str, list[str]]:
        """A machine's healthy devices by the GPU classes they serve: uuids, in device order.

        A device may serve several classes (a Mac's chip serves each Apple class up to its
        memory); the scheduler books it by uuid, so booked for one it is busy for all.
        Quarantined devices and models the catalog does not know serve none.
        """
        healthy = sorted(
            (g for g in inventory.gpus if g.health is GpuHealth.ok), key=lambda g: g.index
        )
        found: dict[str, list[str]] = {}
        for c in self._by_name.values():
            uuids = [g.uuid for g in healthy if c.matches_gpu(g.model, g.memory_mib)]
            if uuids:
                found[c.name] = uuids
        return found

    def offered_by(self, inventory: Inventory) -> list[MachineClass]:
        """The classes a machine offers: a GPU class where one of its devices serves it, a CPU
        class where it has the cores and memory. `/v1/classes` lists these; the scheduler
        places on the same devices (`devices_by_class`)."""
        devices = self.devices_by_class(inventory)
        return [c for c in self._by_name.values() if c.name in devices or c.fits_host(inventory)]

    @classmethod
    def load(cls, extra_file: Path | None = None) -> Catalog:
        """The default catalog, extended (or overridden by name) with a JSON list from a file."""
        classes = {c.name: c for c in DEFAULT_CLASSES}
        if extra_file is not None:
            try:
                raw = json.loads(extra_file.read_text())
                extra = [MachineClass.model_validate(item) for item in raw]
            except (OSError, ValueError, ValidationError, TypeError) as exc:
                raise ConfigError(f"catalog file {extra_file} is not valid: {exc}") from exc
            classes.update({c.name: c for c in extra})
        return cls(list(classes.values()))
