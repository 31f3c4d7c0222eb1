"""NVIDIA GPUs through NVML (`pynvml`, from nvidia-ml-py), every call guarded.

No driver, no library, an old driver without an entry point, a device that errors: each means
fewer GPUs reported (and a log line saying which), never an agent that fails to start. A GPU in
MIG mode is reported as its MIG devices (separate devices, DESIGN.md), not as the whole card.
"""

from __future__ import annotations

import logging
from typing import Any

from einsora.agent.hostvirt import normal_address
from einsora.common.schemas import Gpu

try:
    import pynvml
except ImportError:  # the agent may be installed without nvidia-ml-py on a Mac
    pynvml = None

log = logging.getLogger("einsora.agent")

MIB = 1024 * 1024


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvidia_gpus() -> list[Gpu]:
    """The NVIDIA devices of this machine (empty without NVML)."""
    if pynvml is None:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no library, no driver: no NVIDIA GPUs here
        log.debug("NVML unavailable", extra={"error": str(exc)})
        return []
    try:
        return _devices()
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown failed", extra={"error": str(exc)})


def _devices() -> list[Gpu]:
    gpus: list[Gpu] = []
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        log.warning("NVML could not count devices", extra={"error": str(exc)})
        return gpus
    for i in range(count):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            model, uuid, memory = _describe(handle)
        except pynvml.NVMLError as exc:
            log.warning(
                "GPU unreadable through NVML; skipped", extra={"index": i, "error": str(exc)}
            )
            continue
        migs = _mig_devices(handle)
        for m_model, m_uuid, m_memory in migs:
            gpus.append(
                Gpu(index=len(gpus), uuid=m_uuid, model=m_model, memory_mib=m_memory, mig=True)
            )
        if not migs:
            gpus.append(
                Gpu(
                    index=len(gpus),
                    uuid=uuid,
                    model=model,
                    memory_mib=memory,
                    pci_address=_pci_address(handle),
                )
            )
    return gpus


def _describe(handle: Any) -> tuple[str, str, int]:
    model = _text(pynvml.nvmlDeviceGetName(handle))
    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
    return model, uuid, memory


def _pci_address(handle: Any) -> str | None:
    """The device's PCI address as sysfs names it (`0000:65:00.0`), None when unreadable."""
    try:
        bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
    except pynvml.NVMLError:
        return None
    return normal_address(bus_id)


def _mig_devices(handle: Any) -> list[tuple[str, str, int]]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except pynvml.NVMLError:  # not MIG-capable, or a driver too old to say
        return []
    found: list[tuple[str, str, int]] = []
    for slot in range(slots):
        try:
            found.append(_describe(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except pynvml.NVMLError:  # an empty slot answers NotFound
            continue
    return found
