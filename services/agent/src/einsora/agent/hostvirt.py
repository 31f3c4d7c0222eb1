"""What the host offers VMs: real KVM or not, and which GPUs VFIO can pass through.

**KVM** is decided by the `kvm_intel` or `kvm_amd` module being loaded, never by `/dev/kvm`
alone: a host may expose `/dev/kvm` from a software-only hypervisor (`kvm_pvm`) that boots no
ordinary guest, where qemu's software emulation (TCG) is the only thing that works.

**Passthrough** of a GPU needs an IOMMU group (the IOMMU is on and isolates the device) that
holds nothing but the GPU's own functions (its audio function, say) and PCI bridges: VFIO hands
a whole group to one VM, so a group shared with another device would take that device too.
Both are read from sysfs (`sysfs` is a parameter, so the rules are tested on a made-up tree).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PCI_BRIDGE_CLASS = 0x0604


def available(sysfs: Path = Path("/sys")) -> bool:
    """Whether this host has hardware virtualization qemu can use (KVM for real)."""
    return (sysfs / "module" / "kvm_intel").is_dir() or (sysfs / "module" / "kvm_amd").is_dir()


def normal_address(bus_id: str) -> str:
    """NVML's `00000000:65:00.0` as sysfs names it, `0000:65:00.0`."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


@dataclass(frozen=True)
class Passthrough:
    """Whether a device can be passed through to a VM, and why not when it cannot."""

    iommu_group: int | None
    possible: bool
    note: str = ""


def passthrough(address: str, sysfs: Path = Path("/sys")) -> Passthrough:
    """What VFIO could do with the PCI device at `address`."""
    device = sysfs / "bus" / "pci" / "devices" / address
    if not device.exists():
        return Passthrough(None, False, f"no PCI device {address} in sysfs")
    group_link = device / "iommu_group"
    if not group_link.exists():
        return Passthrough(
            None,
            False,
            "no IOMMU group: turn the IOMMU on (intel_iommu=on or amd_iommu=on, and VT-d or "
            "AMD-Vi in the firmware)",
        )
    group = int(Path(os.readlink(group_link)).name)
    slot = address.rsplit(".", 1)[0]
    others = []
    for member in sorted((group_link / "devices").iterdir()):
        if member.name.rsplit(".", 1)[0] == slot:
            continue  # one of the GPU's own functions (its audio device, say)
        if _class_of(member) >> 8 == PCI_BRIDGE_CLASS:
            continue
        others.append(member.name)
    if others:
        return Passthrough(
            group,
            False,
            f"IOMMU group {group} also holds {', '.join(others)}: passing the GPU through "
            "would take those too (an ACS-capable slot separates them)",
        )
    note = (
        "" if (sysfs / "module" / "vfio_pci").is_dir() else "vfio-pci is loaded when a VM takes it"
    )
    return Passthrough(group, True, note)


def _class_of(device: Path) -> int:
    try:
        return int((device / "class").read_text().strip(), 16)
    except (OSError, ValueError):
        return 0
