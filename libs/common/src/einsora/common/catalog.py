"""The catalog of classes a workload can name: GPU classes (whole GPUs or MIG slices) and CPU
classes.

A GPU class means whole devices of one model and memory, or MIG slices of one profile of one
model; a CPU class means cores and memory. `Catalog.offered_by` and `Catalog.devices_by_class`
are the one match between a machine's inventory and the catalog: the api's `/v1/classes` offers
what they find and the scheduler places on what they find, so a class is never offered where it
cannot be placed.

Hardware the built-in list does not name still works the day it is plugged in: a GPU that no
class matches is offered as an *automatic* class derived from the name and memory NVML reports
(`NVIDIA H200 NVL`, 143,771 MiB → `h200-nvl-140gb`), and each MIG profile a machine offers as a
class of slices (`h200-1g.18gb`). Every service that reads the same inventories derives the same
names, so the api and the scheduler agree without talking. An operator's catalog file (one
setting, `EINSORA_CATALOG`, read by every service) adds or overrides classes by name, renames an
automatic class (a class of its own that matches the device wins) and hides classes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from einsora.common.errors import ConfigError
from einsora.common.schemas.machine import Gpu, GpuHealth, Inventory

CLASS_NAME = r"^[a-z0-9][a-z0-9.-]{0,62}$"
"""A class's name: lower-case letters, digits, `-` and `.` (MIG profiles: `h200-1g.18gb`)."""


class Accelerator(StrEnum):
    """What kind of device a class is."""

    cpu = "cpu"
    nvidia = "nvidia"
    apple = "apple"


class MachineClass(BaseModel):
    """One catalog entry, e.g. `l40s-48gb` or `cpu-4c-16g`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=CLASS_NAME)
    accelerator: Accelerator
    description: str = ""
    model: str | None = None
    """Device model as NVML names it, without the vendor (e.g. `L40S`); GPU classes only. A
    MIG class names its slices' GPU."""
    memory_gib: float = Field(gt=0)
    """Per device for GPU classes (unified memory for Apple); host memory for CPU classes."""
    cpus: float = Field(default=0, ge=0)
    """Cores, for CPU classes."""
    mig_profile: str | None = Field(default=None, pattern=r"^\d+g\.\d+gb$")
    """A class of MIG slices of this profile (`1g.18gb`) of `model` GPUs; None: whole GPUs."""
    automatic: bool = False
    """Derived from a machine's devices, not configured (its description says so)."""

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
        if self.accelerator is Accelerator.cpu or self.model is None or self.mig_profile:
            return False
        if normal_model(model) != self.model.upper():
            return False
        if self.accelerator is Accelerator.apple:
            return memory_mib >= 0.9 * self.memory_mib
        return 0.9 * self.memory_mib <= memory_mib <= 1.1 * self.memory_mib

    def matches(self, gpu: Gpu) -> bool:
        """Whether inventory device `gpu` can serve a workload of this class: a whole GPU
        (never one in MIG mode, which is given out only as its slices) for a class of whole
        GPUs, a slice of this profile of this model for a MIG class."""
        if gpu.mig_mode or self.model is None:
            return False
        if self.mig_profile is None:
            return not gpu.mig and self.matches_gpu(gpu.model, gpu.memory_mib)
        return (
            gpu.mig
            and gpu.mig_profile == self.mig_profile
            and normal_model(parent_model(gpu)) == self.model.upper()
        )

    def fits_host(self, inventory: Inventory) -> bool:
        """Whether a machine has this CPU class's cores and memory in all (CPU classes only)."""
        return (
            self.accelerator is Accelerator.cpu
            and inventory.cpus >= self.cpus
            and inventory.memory_mib >= self.memory_mib
        )


def normal_model(model: str) -> str:
    """A device model as classes name it: upper case, without the vendor (`H200 NVL`)."""
    return model.upper().removeprefix("NVIDIA ").strip()


def parent_model(gpu: Gpu) -> str:
    """The model of a MIG slice's GPU, from the slice's name (`NVIDIA H200 MIG 1g.18gb` →
    `NVIDIA H200`); a whole GPU's own model."""
    if not gpu.mig:
        return gpu.model
    found = re.split(r"\s+MIG\b", gpu.model, maxsplit=1, flags=re.IGNORECASE)
    return found[0].strip() or gpu.model


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def _family(model: str, classes: dict[str, MachineClass], memory_mib: int | None) -> str:
    """The stem of derived class names for GPUs of `model`: a configured class's name without
    its size where one names that model (`h200-141gb` → `h200`), else the model's own words."""
    for c in classes.values():
        if c.mig_profile is None and memory_mib is not None and c.matches_gpu(model, memory_mib):
            return re.sub(r"-\d+(?:\.\d+)?gb$", "", c.name) or c.name
    return _slug(normal_model(model))[:40].strip("-")


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
    """The classes on offer, by name: configured ones, and those derived from the machines'
    devices as their inventories are seen (`learn`)."""

    def __init__(
        self,
        classes: tuple[MachineClass, ...] | list[MachineClass] = DEFAULT_CLASSES,
        *,
        hidden: tuple[str, ...] | list[str] | frozenset[str] = (),
        automatic: bool = True,
    ):
        self._by_name = {c.name: c for c in classes}
        self._derived: dict[str, MachineClass] = {}
        self.hidden = frozenset(hidden)
        """Classes the operator hid: never offered, never placed (automatic ones included)."""
        self.automatic = automatic
        """Whether devices no class matches are offered as automatic classes."""

    def get(self, name: str) -> MachineClass | None:
        if name in self.hidden:
            return None
        return self._by_name.get(name) or self._derived.get(name)

    def __iter__(self) -> Iterator[MachineClass]:
        for c in (*self._by_name.values(), *self._derived.values()):
            if c.name not in self.hidden:
                yield c

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def class_for_gpu(self, model: str, memory_mib: int) -> MachineClass | None:
        """The first GPU class a whole device can serve, or None when the catalog has none."""
        for c in self._by_name.values():
            if c.name not in self.hidden and c.matches_gpu(model, memory_mib):
                return c
        return None

    def derive(self, gpu: Gpu, inventory: Inventory | None = None) -> MachineClass | None:
        """The class derived for a device no configured class matches (None: automatic classes
        are off, or it is a GPU in MIG mode, which only its slices serve)."""
        if not self.automatic or gpu.mig_mode:
            return None
        if gpu.mig:
            return self._derive_mig(gpu, inventory)
        gib = round(gpu.memory_mib / 1024)
        family = _family(gpu.model, {}, None)
        name = self._free_name(f"{family}-{gib}gb", gpu)
        return MachineClass(
            name=name,
            accelerator=Accelerator.nvidia,
            model=normal_model(gpu.model),
            memory_gib=max(gpu.memory_mib / 1024, 0.001),
            description=f"{gpu.model}, {gpu.memory_mib / 1024:.0f} GiB (automatic: no class of "
            "the catalog names this model; the operator's catalog file may rename or hide it)",
            automatic=True,
        )

    def _derive_mig(self, gpu: Gpu, inventory: Inventory | None) -> MachineClass | None:
        if gpu.mig_profile is None:
            return None
        model = parent_model(gpu)
        parent = None
        if inventory is not None and gpu.parent_uuid is not None:
            parent = next((g for g in inventory.gpus if g.uuid == gpu.parent_uuid), None)
        memory = parent.memory_mib if parent is not None else None
        family = _family(model, self._by_name, memory)
        name = self._free_name(f"{family}-{gpu.mig_profile}", gpu)
        return MachineClass(
            name=name,
            accelerator=Accelerator.nvidia,
            model=normal_model(model),
            memory_gib=max(gpu.memory_mib / 1024, 0.001),
            mig_profile=gpu.mig_profile,
            description=f"MIG {gpu.mig_profile} slice of an {model} ({gpu.memory_mib / 1024:.0f} "
            "GiB; automatic: derived from the slices machines offer)",
            automatic=True,
        )

    def _free_name(self, name: str, gpu: Gpu) -> str:
        """`name`, cut to the pattern's length, or with `-auto` where a configured class that
        does not serve `gpu` already has it."""
        name = name[:63].rstrip("-.")
        taken = self._by_name.get(name)
        if taken is not None and not taken.matches(gpu):
            name = f"{name[:58].rstrip('-.')}-auto"
        return name

    def classes_of(self, gpu: Gpu, inventory: Inventory | None = None) -> list[MachineClass]:
        """Every class `gpu` serves, configured ones first; a derived one where none does. A
        hidden class serves nothing (and a device it matches is not offered at all)."""
        matched = [c for c in self._by_name.values() if c.matches(gpu)]
        if matched:
            return [c for c in matched if c.name not in self.hidden]
        derived = self.derive(gpu, inventory)
        if derived is None or derived.name in self.hidden:
            return []
        known = self._derived.setdefault(derived.name, derived)
        return [known]

    def learn(self, inventory: Inventory) -> None:
        """Know the classes derived from this machine's devices (`get` answers them from now)."""
        for gpu in inventory.gpus:
            self.classes_of(gpu, inventory)

    def devices_by_class(self, inventory: Inventory) -> dict[str, list[str]]:
        """A machine's healthy devices by the GPU classes they serve: uuids, in device order.

        A device may serve several classes (a Mac's chip serves each Apple class up to its
        memory); the scheduler books it by uuid, so booked for one it is busy for all.
        Quarantined devices serve none; neither does a GPU in MIG mode (its slices do).
        """
        healthy = sorted(
            (g for g in inventory.gpus if g.health is GpuHealth.ok), key=lambda g: g.index
        )
        found: dict[str, list[str]] = {}
        for gpu in healthy:
            for c in self.classes_of(gpu, inventory):
                found.setdefault(c.name, []).append(gpu.uuid)
        return {c.name: found[c.name] for c in self if c.name in found}

    def offered_by(self, inventory: Inventory) -> list[MachineClass]:
        """The classes a machine offers: a GPU class where one of its devices serves it, a CPU
        class where it has the cores and memory. `/v1/classes` lists these; the scheduler
        places on the same devices (`devices_by_class`)."""
        devices = self.devices_by_class(inventory)
        return [c for c in self if c.name in devices or c.fits_host(inventory)]

    @classmethod
    def load(cls, extra_file: Path | None = None) -> Catalog:
        """The default catalog, changed by the operator's JSON file: a list of classes (added,
        or overriding a class of that name), or an object with `classes`, `hide` (names never
        offered) and `automatic` (false: no class is derived from devices no class names)."""
        classes = {c.name: c for c in DEFAULT_CLASSES}
        if extra_file is None:
            return cls(list(classes.values()))
        try:
            raw = json.loads(extra_file.read_text())
            config = CatalogFile.model_validate({"classes": raw} if isinstance(raw, list) else raw)
        except (OSError, ValueError, ValidationError, TypeError) as exc:
            raise ConfigError(f"catalog file {extra_file} is not valid: {exc}") from exc
        classes.update({c.name: c for c in config.classes})
        return cls(list(classes.values()), hidden=config.hide, automatic=config.automatic)


class CatalogFile(BaseModel):
    """The operator's catalog file, as an object."""

    model_config = ConfigDict(extra="forbid")

    classes: list[MachineClass] = Field(default_factory=list)
    hide: list[str] = Field(default_factory=list)
    automatic: bool = True
