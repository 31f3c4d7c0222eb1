"""`einsora agent gpus`: what the agent sees of this machine's GPUs, before anything runs.

An operator plugging in a card, or turning MIG on, asks three questions: does Einsora see it,
what class will it be offered as, and will workloads be held to their own devices. This answers
all three from the same code the agent reports with (`nvml`, the catalog, `devices`). `--json`
prints the NVML snapshot itself: saved to a file, it is what `--gpu-inventory` reads, so a
machine can be recorded once and replayed anywhere.
"""

from __future__ import annotations

import sys
from typing import TextIO

from einsora.agent import nvml
from einsora.agent.drivers import devices
from einsora.common.catalog import Catalog
from einsora.common.schemas import Inventory
from einsora.common.settings import Settings


def show(settings: Settings, *, as_json: bool = False, out: TextIO = sys.stdout) -> int:
    """Print this machine's GPUs (or the snapshot `settings.gpu_inventory` names); 0."""
    if settings.gpu_inventory is not None:
        snapshot = nvml.load(settings.gpu_inventory)
    else:
        snapshot = nvml.read() or nvml.NvmlSnapshot(source="nvml: not available here")
    if as_json:
        print(snapshot.model_dump_json(indent=2, exclude_defaults=False), file=out)
        return 0
    gpus = nvml.gpus_of(snapshot)
    catalog = Catalog.load(settings.catalog)
    inventory = Inventory(
        machine_id="this", region="", hostname="", os="", arch="", cpus=1, memory_mib=1, gpus=gpus
    )
    index = {g.uuid: g.index for g in gpus}
    rows: list[tuple[str, ...]] = []
    for gpu in gpus:
        if gpu.mig_mode:
            serves = "(MIG mode: given out as its slices only)"
        else:
            found = catalog.classes_of(gpu, inventory)
            serves = (
                ", ".join(c.name + (" (automatic)" if c.automatic else "") for c in found)
                or "(hidden: not offered)"
            )
        what = gpu.model
        if gpu.mig and gpu.parent_uuid in index:
            what = f"{gpu.model} (of #{index[gpu.parent_uuid]})"
        rows.append(
            (
                str(gpu.index),
                gpu.uuid,
                what,
                f"{gpu.memory_mib:,} MiB",
                " ".join(gpu.device_numbers) or "-",
                serves,
            )
        )
    print(
        f"source: {snapshot.source}" + (f", driver {snapshot.driver}" if snapshot.driver else ""),
        file=out,
    )
    if not rows:
        print("no NVIDIA GPU", file=out)
    else:
        _table(rows, ("#", "uuid", "device", "memory", "nodes", "class"), out)
    confiner = devices.Confiner.probe()
    how = confiner.method.value if confiner.method is not None else f"none: {confiner.note}"
    print(f"device nodes of process workloads: {how}", file=out)
    return 0


def _table(rows: list[tuple[str, ...]], headers: tuple[str, ...], out: TextIO) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
