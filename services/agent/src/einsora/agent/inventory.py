"""What this machine has: OS, architecture, CPUs, memory, GPUs, and the drivers the agent runs.

GPUs come from NVML where present (or from an NVML snapshot file: `nvml.load`), each with its PCI
address, IOMMU group and whether a VM can be given it (`hostvirt`), its device nodes, and for a GPU
in MIG mode its slices (`nvml`); on a Mac with Apple Silicon, the chip and its unified memory come
from `sysctl` and are reported as one GPU of model `Apple Silicon` (the catalog's
`apple-silicon-<n>gb` classes match it). The endpoint runtimes it can serve come from
`runtimes.available`. The inventory reports; it never decides the machine's owner, region or
sharing.
"""

from __future__ import annotations

import logging
import platform
import socket
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil

from einsora.agent import hostvirt
from einsora.agent.nvml import nvidia_gpus
from einsora.agent.runtimes.available import available_runtimes
from einsora.common.schemas import DeviceConfinement, DriverReport, Gpu, Inventory

log = logging.getLogger("einsora.agent")

MIB = 1024 * 1024


def agent_version() -> str:
    try:
        return version("einsora-agent")
    except PackageNotFoundError:
        return ""


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(
            ["/usr/sbin/sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("sysctl failed", extra={"name": name, "error": repr(exc)})
        return None
    return out.stdout.strip() or None


def apple_silicon() -> tuple[str, int] | None:
    """(chip, unified memory MiB) on a Mac with Apple Silicon, else None."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return None
    chip = _sysctl("machdep.cpu.brand_string") or "Apple Silicon"
    memsize = _sysctl("hw.memsize")
    memory = (
        int(memsize) // MIB
        if memsize and memsize.isdigit()
        else psutil.virtual_memory().total // MIB
    )
    return chip, memory


def with_passthrough(gpus: list[Gpu], sysfs: Path = Path("/sys")) -> list[Gpu]:
    """Each GPU with its IOMMU group and whether VFIO can pass it through to a VM."""
    checked = []
    for gpu in gpus:
        if gpu.pci_address is None or gpu.mig:
            checked.append(gpu)
            continue
        found = hostvirt.passthrough(gpu.pci_address, sysfs)
        checked.append(
            gpu.model_copy(
                update={
                    "iommu_group": found.iommu_group,
                    "passthrough": found.possible,
                    "passthrough_note": found.note,
                }
            )
        )
    return checked


def collect(
    machine_id: str,
    region: str,
    drivers: list[str],
    engines: list[DriverReport] | None = None,
    sysfs: Path = Path("/sys"),
    *,
    gpu_file: Path | None = None,
    confinement: DeviceConfinement | None = None,
) -> Inventory:
    """This machine's inventory now (blocking: NVML and sysctl may take a moment). `drivers`
    are the agent's own; each available engine's driver (`engines`) is listed after them.
    `gpu_file`: an NVML snapshot to read the GPUs from instead of NVML; `confinement`: what the
    process driver found it can do to confine device nodes."""
    engines = engines or []
    drivers = [*drivers, *(e.name for e in engines if e.available and e.name not in drivers)]
    gpus = with_passthrough(nvidia_gpus(gpu_file), sysfs)
    runtimes = available_runtimes(drivers, nvidia=len(gpus))
    apple = apple_silicon()
    if apple is not None:
        gpus.append(
            Gpu(
                index=len(gpus),
                uuid=f"apple-{machine_id}",
                model="Apple Silicon",
                memory_mib=apple[1],
            )
        )
    return Inventory(
        machine_id=machine_id,
        region=region,
        hostname=socket.gethostname(),
        os=platform.system().lower(),
        arch=platform.machine(),
        cpus=psutil.cpu_count(logical=True) or 1,
        memory_mib=psutil.virtual_memory().total // MIB,
        gpus=gpus,
        apple_chip=None if apple is None else apple[0],
        unified_memory_mib=None if apple is None else apple[1],
        drivers=drivers,
        engines=engines,
        runtimes=runtimes,
        device_confinement=confinement,
        agent_version=agent_version(),
    )


def same(a: Inventory, b: Inventory) -> bool:
    """Whether two inventories say the same thing (their time aside)."""
    return a.model_dump(exclude={"at"}) == b.model_dump(exclude={"at"})
