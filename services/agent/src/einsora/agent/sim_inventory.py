"""`--sim-inventory`: the fake machine a sim agent declares, from a short spec or a file.

`"4x l40s-48gb, 64 cpu, 512 GiB"` means four L40S GPUs (built from the catalog), 64 cores and
512 GiB of memory. A file holds the same text, or JSON:
`{"gpus": {"l40s-48gb": 4}, "cpus": 64, "memory_gib": 512}`. Optional `os=`, `arch=`,
`hostname=` items (JSON keys) set what else the inventory says. Fake GPU UUIDs are stable per
machine id, so a restarted sim agent reports the same devices. A sim machine serves every
endpoint runtime (the sim driver simulates them all).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from einsora.agent.runtimes.available import available_runtimes
from einsora.common.catalog import Accelerator, Catalog, MachineClass
from einsora.common.errors import ConfigError
from einsora.common.schemas import Gpu, Inventory

DEFAULT_CPUS = 8
DEFAULT_MEMORY_MIB = 32 * 1024
EXAMPLE = '"4x l40s-48gb, 64 cpu, 512 GiB"'

_UNITS = {
    "mib": 1,
    "m": 1,
    "mb": 1,
    "gib": 1024,
    "g": 1024,
    "gb": 1024,
    "tib": 1024**2,
    "t": 1024**2,
    "tb": 1024**2,
}
_COUNT_CLASS = re.compile(r"^(?:(\d+)\s*[x×*]\s*)?([a-z0-9][a-z0-9-]*)$")
_CPUS = re.compile(r"^(\d+)\s*(?:cpus?|cores?|vcpus?)$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z]+)(?:\s+(?:memory|ram|mem))?$")
_KEY_VALUE = re.compile(r"^(os|arch|hostname)\s*=\s*(\S+)$")


@dataclass
class SimMachine:
    """What a sim machine has."""

    gpus: list[tuple[MachineClass, int]] = field(default_factory=list)
    cpus: int = DEFAULT_CPUS
    memory_mib: int = DEFAULT_MEMORY_MIB
    os: str | None = None
    arch: str | None = None
    hostname: str | None = None

    def inventory(self, machine_id: str, region: str, drivers: list[str]) -> Inventory:
        gpus: list[Gpu] = []
        apple: MachineClass | None = None
        for cls, count in self.gpus:
            if cls.accelerator is Accelerator.apple:
                apple = cls
            for _ in range(count):
                index = len(gpus)
                fake = uuid.uuid5(uuid.NAMESPACE_URL, f"einsora-sim:{machine_id}:{index}")
                gpus.append(
                    Gpu(
                        index=index,
                        uuid=f"GPU-{fake}",
                        model=cls.model or cls.name,
                        memory_mib=cls.memory_mib,
                    )
                )
        return Inventory(
            machine_id=machine_id,
            region=region,
            hostname=self.hostname or f"sim-{machine_id}",
            os=self.os or ("darwin" if apple else "linux"),
            arch=self.arch or ("arm64" if apple else "x86_64"),
            cpus=self.cpus,
            memory_mib=self.memory_mib,
            gpus=gpus,
            apple_chip=None if apple is None else "Apple Silicon (sim)",
            unified_memory_mib=None if apple is None else apple.memory_mib,
            drivers=drivers,
            runtimes=available_runtimes(drivers),
        )


def load(spec: str, catalog: Catalog | None = None) -> SimMachine:
    """A spec string, or the path of a file holding one (text or JSON)."""
    catalog = catalog or Catalog.load()
    text = spec.strip()
    path = Path(text).expanduser()
    if text and not text.startswith("{") and ("/" in text or path.suffix) and path.is_file():
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--sim-inventory file {path} cannot be read: {exc}") from exc
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--sim-inventory JSON is not valid: {exc}") from exc
        return from_json(data, catalog)
    return parse(text, catalog)


def parse(text: str, catalog: Catalog) -> SimMachine:
    """`4x l40s-48gb, 64 cpu, 512 GiB` (items separated by commas or new lines)."""
    machine = SimMachine()
    cpus: int | None = None
    memory: int | None = None
    items = [i.strip() for i in re.split(r"[,\n;]", text.lower()) if i.strip()]
    if not items:
        raise ConfigError(f"--sim-inventory is empty; for example {EXAMPLE}")
    for item in items:
        if m := _KEY_VALUE.match(item):
            setattr(machine, m[1], m[2])
        elif m := _CPUS.match(item):
            cpus = (cpus or 0) + int(m[1])
        elif (m := _MEMORY.match(item)) and m[2] in _UNITS:
            memory = (memory or 0) + int(float(m[1]) * _UNITS[m[2]])
        elif m := _COUNT_CLASS.match(item):
            _add_class(machine, catalog, m[2], int(m[1] or 1))
            cls = catalog.get(m[2])
            if cls is not None and cls.accelerator is Accelerator.cpu:
                count = int(m[1] or 1)
                cpus = (cpus or 0) + int(cls.cpus) * count
                memory = (memory or 0) + cls.memory_mib * count
        else:
            raise ConfigError(
                f"--sim-inventory item {item!r} is not understood; write items such as {EXAMPLE}"
            )
    machine.cpus = cpus if cpus is not None else DEFAULT_CPUS
    machine.memory_mib = memory if memory is not None else DEFAULT_MEMORY_MIB
    return machine


def _add_class(machine: SimMachine, catalog: Catalog, name: str, count: int) -> None:
    cls = catalog.get(name)
    if cls is None:
        known = ", ".join(c.name for c in catalog)
        raise ConfigError(f"--sim-inventory names an unknown class {name!r}; known: {known}")
    if count < 1:
        raise ConfigError(f"--sim-inventory: a count of {name} must be at least 1")
    if cls.accelerator is not Accelerator.cpu:
        machine.gpus.append((cls, count))


def from_json(data: Any, catalog: Catalog) -> SimMachine:
    if not isinstance(data, dict):
        raise ConfigError(
            "--sim-inventory JSON must be an object such as "
            '{"gpus": {"l40s-48gb": 4}, "cpus": 64, "memory_gib": 512}'
        )
    machine = SimMachine()
    gpus = data.get("gpus", {})
    pairs: list[tuple[Any, Any]]
    if isinstance(gpus, dict):
        pairs = list(gpus.items())
    elif isinstance(gpus, list):
        pairs = [
            (g.get("class"), g.get("count", 1)) if isinstance(g, dict) else (g, 1) for g in gpus
        ]
    else:
        raise ConfigError("--sim-inventory JSON: gpus must be an object or a list")
    for name, count in pairs:
        if not isinstance(name, str) or not isinstance(count, int) or isinstance(count, bool):
            raise ConfigError(f"--sim-inventory JSON: gpus entry {name!r}: {count!r} is not valid")
        _add_class(machine, catalog, name, count)
    machine.cpus = _int(data, "cpus", DEFAULT_CPUS)
    if "memory" in data:
        memory = parse(str(data["memory"]), catalog).memory_mib
        machine.memory_mib = memory
    elif "memory_gib" in data:
        machine.memory_mib = _int(data, "memory_gib", 0) * 1024
    elif "memory_mib" in data:
        machine.memory_mib = _int(data, "memory_mib", DEFAULT_MEMORY_MIB)
    for key in ("os", "arch", "hostname"):
        if isinstance(data.get(key), str):
            setattr(machine, key, data[key])
    return machine


def _int(data: dict[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"--sim-inventory JSON: {key} must be a whole number ≥ 0, not {value!r}")
    return value
