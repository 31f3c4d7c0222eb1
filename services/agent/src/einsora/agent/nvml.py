"""NVIDIA GPUs through NVML (`pynvml`, from nvidia-ml-py), every call guarded, or from a file.

Reading is two steps: `read` takes what NVML says of each device (an `NvmlSnapshot`: names,
uuids, memory, device minors, MIG mode and slices), and `gpus_of` turns a snapshot into the
inventory's `Gpu`s. A snapshot can also be loaded from a JSON file (`load`): a recording of a
real machine, or a hand-written one, so the agent's whole GPU path (inventory, classes, device
assignment, confinement) runs on a machine without the hardware, in tests and to check what
Einsora would make of a machine. `einsora agent gpus --json` prints this machine's snapshot in
that format.

No driver, no library, an old driver without an entry point, a device that errors: each means
fewer GPUs reported (and a log line saying which), never an agent that fails to start. A GPU in
MIG mode is listed whole with `mig_mode` (never given out as it is) and each of its slices as a
device of its own, with its profile, its parent and the capability nodes that open it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from einsora.agent.hostvirt import normal_address
from einsora.common.errors import ConfigError
from einsora.common.schemas import Gpu

try:
    import pynvml
except ImportError:  # the agent may be installed without nvidia-ml-py on a Mac
    pynvml = None

log = logging.getLogger("einsora.agent")

MIB = 1024 * 1024
NVIDIA_MAJOR = 195
"""The character major of `/dev/nvidia<N>` (fixed by the driver; `nvidiactl` is minor 255)."""
PROC_DEVICES = Path("/proc/devices")
PROC_CAPABILITIES = Path("/proc/driver/nvidia/capabilities")
_PROFILE = re.compile(r"\bMIG\s+(\d+g\.\d+gb)\b", re.IGNORECASE)


class NvmlSlice(BaseModel):
    """One MIG device of a GPU, as NVML describes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """`NVIDIA H200 MIG 1g.18gb`: the profile is read from it."""
    uuid: str
    memory_mib: int = Field(ge=0)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    cap_minors: list[int] = Field(default_factory=list)
    """The minors of the `nvidia-caps` nodes that open it (its GPU and compute instances')."""


class NvmlDevice(BaseModel):
    """One GPU, as NVML describes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    uuid: str
    memory_mib: int = Field(ge=0)
    minor: int | None = None
    """Its `/dev/nvidia<minor>`."""
    pci_bus_id: str | None = None
    mig_mode: bool = False
    slices: list[NvmlSlice] = Field(default_factory=list)


class NvmlSnapshot(BaseModel):
    """What NVML says of a machine's GPUs at one moment: read live, or loaded from a file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = "nvml"
    """Where it came from: `nvml`, or a note on the recording (machine, date)."""
    driver: str | None = None
    caps_major: int | None = None
    """The character major of `nvidia-caps` (`/proc/devices`), where MIG slices are opened."""
    devices: list[NvmlDevice] = Field(default_factory=list)


def load(path: Path) -> NvmlSnapshot:
    """A snapshot from a JSON file (a ConfigError naming the file and the field when wrong)."""
    try:
        return NvmlSnapshot.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"GPU inventory file {path} cannot be read: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"GPU inventory file {path} is not valid: {problems}") from exc


def profile_of(name: str) -> str | None:
    """The MIG profile in a slice's NVML name (`NVIDIA H200 MIG 1g.18gb` → `1g.18gb`)."""
    found = _PROFILE.search(name)
    return found[1].lower() if found else None


def gpus_of(snapshot: NvmlSnapshot) -> list[Gpu]:
    """The inventory's GPUs: each GPU, and after one in MIG mode each of its slices."""
    gpus: list[Gpu] = []
    for device in snapshot.devices:
        node = [] if device.minor is None else [f"{NVIDIA_MAJOR}:{device.minor}"]
        pci = None if device.pci_bus_id is None else normal_address(device.pci_bus_id)
        gpus.append(
            Gpu(
                index=len(gpus),
                uuid=device.uuid,
                model=device.name,
                memory_mib=device.memory_mib,
                mig_mode=device.mig_mode,
                device_numbers=node,
                pci_address=pci,
            )
        )
        if not device.mig_mode:
            continue
        for part in device.slices:
            caps = (
                []
                if snapshot.caps_major is None
                else [f"{snapshot.caps_major}:{m}" for m in part.cap_minors]
            )
            gpus.append(
                Gpu(
                    index=len(gpus),
                    uuid=part.uuid,
                    model=part.name,
                    memory_mib=part.memory_mib,
                    mig=True,
                    mig_profile=profile_of(part.name),
                    parent_uuid=device.uuid,
                    device_numbers=[*node, *caps][:8],
                )
            )
    return gpus


def nvidia_gpus(snapshot_file: Path | None = None) -> list[Gpu]:
    """The NVIDIA devices of this machine (empty without NVML), or those of `snapshot_file`."""
    snapshot = load(snapshot_file) if snapshot_file is not None else read()
    return [] if snapshot is None else gpus_of(snapshot)


def read() -> NvmlSnapshot | None:
    """What NVML says now; None without NVML (no library, no driver)."""
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no library, no driver: no NVIDIA GPUs here
        log.debug("NVML unavailable", extra={"error": str(exc)})
        return None
    try:
        return NvmlSnapshot(
            driver=_guarded(pynvml.nvmlSystemGetDriverVersion),
            caps_major=char_major("nvidia-caps"),
            devices=_devices(),
        )
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown failed", extra={"error": str(exc)})


def char_major(driver: str, proc_devices: Path = PROC_DEVICES) -> int | None:
    """The character major `driver` has in `/proc/devices`, None when it has none."""
    try:
        text = proc_devices.read_text()
    except OSError:
        return None
    characters = text.split("Block devices:")[0]
    for line in characters.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == driver and parts[0].isdigit():
            return int(parts[0])
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _guarded(call: Any, *args: Any) -> Any:
    try:
        value = call(*args)
    except pynvml.NVMLError:
        return None
    return _text(value) if isinstance(value, bytes | str) else value


def _devices() -> list[NvmlDevice]:
    devices: list[NvmlDevice] = []
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        log.warning("NVML could not count devices", extra={"error": str(exc)})
        return devices
    for i in range(count):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name, uuid, memory = _describe(handle)
        except pynvml.NVMLError as exc:
            log.warning(
                "GPU unreadable through NVML; skipped", extra={"index": i, "error": str(exc)}
            )
            continue
        minor = _guarded(pynvml.nvmlDeviceGetMinorNumber, handle)
        mig_mode = _mig_mode(handle)
        devices.append(
            NvmlDevice(
                name=name,
                uuid=uuid,
                memory_mib=memory,
                minor=minor if isinstance(minor, int) else None,
                pci_bus_id=_pci_bus_id(handle),
                mig_mode=mig_mode,
                slices=_slices(handle, minor if isinstance(minor, int) else None)
                if mig_mode
                else [],
            )
        )
    return devices


def _describe(handle: Any) -> tuple[str, str, int]:
    model = _text(pynvml.nvmlDeviceGetName(handle))
    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
    return model, uuid, memory


def _pci_bus_id(handle: Any) -> str | None:
    try:
        return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
    except pynvml.NVMLError:
        return None


def _mig_mode(handle: Any) -> bool:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # not MIG-capable, or a driver too old to say
        return False
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _slices(handle: Any, minor: int | None) -> list[NvmlSlice]:
    try:
        slots = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except pynvml.NVMLError:
        return []
    found: list[NvmlSlice] = []
    for slot in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            name, uuid, memory = _describe(mig)
        except pynvml.NVMLError:  # an empty slot answers NotFound
            continue
        gi = _guarded(pynvml.nvmlDeviceGetGpuInstanceId, mig)
        ci = _guarded(pynvml.nvmlDeviceGetComputeInstanceId, mig)
        gi = gi if isinstance(gi, int) else None
        ci = ci if isinstance(ci, int) else None
        found.append(
            NvmlSlice(
                name=name,
                uuid=uuid,
                memory_mib=memory,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                cap_minors=cap_minors(minor, gi, ci),
            )
        )
    return found


def cap_minors(
    minor: int | None, gi: int | None, ci: int | None, root: Path = PROC_CAPABILITIES
) -> list[int]:
    """The `nvidia-caps` minors that open GPU instance `gi` and its compute instance `ci` of
    GPU `minor`, as the driver lists them under `/proc/driver/nvidia/capabilities`."""
    if minor is None or gi is None:
        return []
    gi_dir = root / f"gpu{minor}" / "mig" / f"gi{gi}"
    files = [gi_dir / "access"]
    if ci is not None:
        files.append(gi_dir / f"ci{ci}" / "access")
    found: list[int] = []
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
                found.append(int(value.strip()))
    return found
