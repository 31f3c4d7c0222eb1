"""A VM's libvirt domain XML, from a plain plan: what the libvirt driver defines.

A pure function, so every domain the driver can define (direct kernel boot or not, KVM or
software emulation, GPUs passed through) is a golden test without libvirt. The domain carries
the workload's facts in its `<metadata>` (workload, machine and the host ports it uses), so a
restarted agent finds its VMs from libvirt alone.

Networking is qemu's user mode (no bridge, no firewall rules, no root helper on the host): the
guest reaches out through NAT, and only the ports named here are forwarded to it, each from
127.0.0.1 on the host. libvirt has no element for those forwards with the slirp backend, so
they are qemu arguments (`<qemu:commandline>`), on a PCI slot libvirt does not hand out.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
EINSORA_NS = "https://einsora.dev/xmlns/libvirt/1"
NIC_SLOT = "0x10"
"""The PCI slot of the user-mode NIC: above what libvirt assigns to the few devices here."""

ET.register_namespace("qemu", QEMU_NS)
ET.register_namespace("einsora", EINSORA_NS)


@dataclass(frozen=True)
class Forward:
    """A guest port reached at 127.0.0.1:`host_port` on the host."""

    name: str
    host_port: int
    guest_port: int


@dataclass(frozen=True)
class DomainPlan:
    """Everything a VM's domain is made of."""

    name: str
    workload_id: str
    machine_id: str
    vcpus: int
    memory_mib: int
    kvm: bool
    disk: str
    disk_format: str = "qcow2"
    seed: str | None = None
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str = ""
    forwards: tuple[Forward, ...] = ()
    hostdevs: tuple[str, ...] = ()
    """PCI addresses (`0000:65:00.0`) passed through whole by VFIO."""
    ports: dict[str, int] = field(default_factory=dict)
    """The host ports to remember in the metadata (the forwards' and the console relay's)."""


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = text
    return element


def pci_address(address: str) -> dict[str, str]:
    """`0000:65:00.0` as libvirt's address attributes (ValueError when it is not one)."""
    try:
        domain, bus, rest = address.split(":")
        slot, function = rest.split(".")
        parts = (int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16))
    except ValueError:
        raise ValueError(f"not a PCI address: {address!r}") from None
    if parts[0] > 0xFFFF or parts[1] > 0xFF or parts[2] > 0x1F or parts[3] > 0x7:
        raise ValueError(f"not a PCI address: {address!r}")
    return {
        "domain": f"0x{parts[0]:04x}",
        "bus": f"0x{parts[1]:02x}",
        "slot": f"0x{parts[2]:02x}",
        "function": f"0x{parts[3]:x}",
    }


def netdev_argument(forwards: tuple[Forward, ...]) -> str:
    """qemu's `-netdev user,…` value: NAT out, each forward from 127.0.0.1 in."""
    parts = ["user", "id=einsora0"]
    parts += [f"hostfwd=tcp:127.0.0.1:{f.host_port}-:{f.guest_port}" for f in forwards]
    return ",".join(parts)


def domain_xml(plan: DomainPlan) -> str:
    """The domain XML of `plan` (indented, so a person can read `virsh dumpxml` against it)."""
    root = ET.Element("domain", {"type": "kvm" if plan.kvm else "qemu"})
    _sub(root, "name", plan.name)
    _sub(root, "title", f"Einsora workload {plan.workload_id}")
    meta = _sub(root, "metadata")
    workload = ET.SubElement(
        meta,
        f"{{{EINSORA_NS}}}workload",
        {"id": plan.workload_id, "machine": plan.machine_id},
    )
    for name, port in sorted(plan.ports.items()):
        ET.SubElement(workload, f"{{{EINSORA_NS}}}port", {"name": name, "host": str(port)})
    _sub(root, "memory", str(plan.memory_mib), unit="MiB")
    _sub(root, "vcpu", str(plan.vcpus))
    os_ = _sub(root, "os")
    _sub(os_, "type", "hvm", arch="x86_64", machine="pc")
    if plan.kernel is not None:
        _sub(os_, "kernel", plan.kernel)
        if plan.initrd is not None:
            _sub(os_, "initrd", plan.initrd)
        if plan.cmdline:
            _sub(os_, "cmdline", plan.cmdline)
    else:
        _sub(os_, "boot", dev="hd")
    features = _sub(root, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    if plan.kvm:
        _sub(root, "cpu", mode="host-passthrough")
    _sub(root, "clock", offset="utc")
    _sub(root, "on_poweroff", "destroy")
    _sub(root, "on_reboot", "restart")
    _sub(root, "on_crash", "destroy")
    devices = _sub(root, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type=plan.disk_format, discard="unmap")
    _sub(disk, "source", file=plan.disk)
    _sub(disk, "target", dev="vda", bus="virtio")
    if plan.seed is not None:
        seed = _sub(devices, "disk", type="file", device="disk")
        _sub(seed, "driver", name="qemu", type="raw")
        _sub(seed, "source", file=plan.seed)
        _sub(seed, "target", dev="vdb", bus="virtio")
        _sub(seed, "readonly")
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "target", port="0")
    console = _sub(devices, "console", type="pty")
    _sub(console, "target", type="serial", port="0")
    channel = _sub(devices, "channel", type="unix")
    _sub(channel, "target", type="virtio", name="org.qemu.guest_agent.0")
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    for address in plan.hostdevs:
        hostdev = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
        source = _sub(hostdev, "source")
        _sub(source, "address", **pci_address(address))
    commandline = ET.SubElement(root, f"{{{QEMU_NS}}}commandline")
    for value in (
        "-netdev",
        netdev_argument(plan.forwards),
        "-device",
        f"virtio-net-pci,netdev=einsora0,bus=pci.0,addr={NIC_SLOT}",
    ):
        ET.SubElement(commandline, f"{{{QEMU_NS}}}arg", {"value": value})
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


@dataclass(frozen=True)
class DomainFacts:
    """What the agent reads back from a defined domain's XML."""

    workload_id: str | None
    machine_id: str | None
    ports: dict[str, int]
    console_pty: str | None
    """The host's pseudo-terminal of its serial console (live XML of a running domain)."""
    hostdevs: int


def read_domain(xml: str) -> DomainFacts:
    """The Einsora metadata and the console's pty of a domain's XML."""
    root = ET.fromstring(xml)  # noqa: S314 - libvirt's own output, not a user's
    workload = root.find(f"metadata/{{{EINSORA_NS}}}workload")
    ports: dict[str, int] = {}
    if workload is not None:
        for port in workload.findall(f"{{{EINSORA_NS}}}port"):
            name, host = port.get("name"), port.get("host")
            if name and host and host.isdigit():
                ports[name] = int(host)
    source = root.find("devices/serial/source")
    return DomainFacts(
        workload_id=None if workload is None else workload.get("id"),
        machine_id=None if workload is None else workload.get("machine"),
        ports=ports,
        console_pty=None if source is None else source.get("path"),
        hostdevs=len(root.findall("devices/hostdev")),
    )
