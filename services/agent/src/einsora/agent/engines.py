"""The engines behind the agent's drivers: whether libvirt and Docker answer, and what they offer.

Probed when the inventory is collected (at start and every refresh), so an engine started or
stopped later shows up in the next inventory. A driver whose engine does not answer is not
listed in the inventory's `drivers` (the scheduler places nothing there for it); its
`DriverReport` says why, in words. libvirt's report says whether VMs run under KVM or software
emulation (`hostvirt`); Docker's lists its runtimes, and a Kata runtime adds the
`docker-kata` driver, whose containers each run in their own VM.

Blocking (libvirt and Docker clients are): call it in a thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from einsora.agent import hostvirt
from einsora.agent.drivers.container.driver import client as docker_client
from einsora.agent.drivers.container.driver import docker_url, unix_socket_refusal
from einsora.common.schemas import DriverReport, Virtualization

log = logging.getLogger("einsora.agent")

LIBVIRT = "libvirt"
DOCKER = "docker"
DOCKER_KATA = "docker-kata"


@dataclass(frozen=True)
class EngineOptions:
    """Which engines the agent looks for, and where."""

    libvirt: bool = True
    libvirt_uri: str = "qemu:///system"
    docker: bool = True
    docker_host: str | None = None
    """None: `DOCKER_HOST`, or Docker's default socket."""
    vm_dir: Path = Path("/var/lib/einsora-vms")
    vm_images: tuple[Path, ...] = field(default=())
    """Directories a VM's local image may come from (besides `<vm_dir>/images`)."""
    sysfs: Path = Path("/sys")
    timeout_s: float = 5.0


def kata_runtime(runtimes: list[str]) -> str | None:
    """The name of a Kata runtime among Docker's (`kata`, `io.containerd.kata.v2`, …)."""
    return next((r for r in sorted(runtimes) if "kata" in r.lower()), None)


def probe_libvirt(options: EngineOptions) -> DriverReport:
    """Whether libvirt answers at `libvirt_uri`, and KVM or emulation."""
    virtualization = (
        Virtualization.kvm if hostvirt.available(options.sysfs) else Virtualization.emulated
    )
    try:
        import libvirt
    except ImportError:
        return DriverReport(
            name=LIBVIRT,
            available=False,
            detail="libvirt-python is not installed: pip install 'einsora-agent[libvirt]'",
        )
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        conn = libvirt.open(options.libvirt_uri)
    except libvirt.libvirtError as exc:
        return DriverReport(
            name=LIBVIRT,
            available=False,
            detail=f"libvirt at {options.libvirt_uri} does not answer: {exc.get_error_message()}",
        )
    try:
        version = _version(conn.getLibVersion())
        hypervisor = _version(conn.getVersion())
    except libvirt.libvirtError as exc:
        version = hypervisor = f"unknown ({exc.get_error_message()})"
    finally:
        conn.close()
    how = (
        "KVM"
        if virtualization is Virtualization.kvm
        else "software emulation (no kvm_intel or kvm_amd module)"
    )
    return DriverReport(
        name=LIBVIRT,
        available=True,
        detail=f"libvirt {version} at {options.libvirt_uri}, qemu {hypervisor}, {how}",
        virtualization=virtualization,
    )


def probe_docker(options: EngineOptions) -> list[DriverReport]:
    """Whether Docker Engine answers, its runtimes, and `docker-kata` when one is Kata."""
    url = docker_url(options.docker_host)
    where = url.removeprefix("unix://")
    refused = unix_socket_refusal(url, options.timeout_s)
    if refused is not None:
        return [
            DriverReport(name=DOCKER, available=False, detail=f"Docker does not answer: {refused}")
        ]
    try:
        import docker
        import docker.errors
    except ImportError:
        return [DriverReport(name=DOCKER, available=False, detail="the docker package is missing")]
    try:
        client: Any = docker_client(url, options.timeout_s)
        try:
            info = client.info()
        finally:
            client.close()
    except (docker.errors.DockerException, OSError) as exc:
        text = str(exc).split("\n")[0][:200]
        return [
            DriverReport(
                name=DOCKER, available=False, detail=f"Docker at {where} does not answer: {text}"
            )
        ]
    runtimes = sorted(info.get("Runtimes") or {})
    gpus = "nvidia" in runtimes or bool(info.get("CDISpecDirs"))
    detail = f"Docker {info.get('ServerVersion', '?')} at {where}, runtimes {', '.join(runtimes)}"
    reports = [
        DriverReport(name=DOCKER, available=True, detail=detail, runtimes=runtimes, gpus=gpus)
    ]
    kata = kata_runtime(runtimes)
    reports.append(
        DriverReport(
            name=DOCKER_KATA,
            available=kata is not None,
            detail=f"runtime {kata}" if kata else "no Kata runtime in Docker",
            runtimes=[kata] if kata else [],
        )
    )
    return reports


def probe(options: EngineOptions) -> list[DriverReport]:
    """Every engine the options ask for."""
    reports: list[DriverReport] = []
    if options.libvirt:
        reports.append(probe_libvirt(options))
    if options.docker:
        reports.extend(probe_docker(options))
    return reports


def _version(number: int) -> str:
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"
