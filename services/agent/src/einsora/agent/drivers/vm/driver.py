"""The `libvirt` driver: a `vm` workload is a libvirt domain on `qemu:///system`.

**Start.** Its spec (`VmSpec`) names a disk image, checked and imported (`images`); the VM's own
disk is a qcow2 layer over it in `<vm_dir>/<workload>/` with its NoCloud seed (`seed`). The
domain (`domain`) is named `einsora-<workload>` and carries the workload, the machine and its
host ports in its metadata. It runs under KVM when the host really has it (`kvm_intel` or
`kvm_amd` loaded: `/dev/kvm` alone can be a software hypervisor that boots no ordinary guest),
else under qemu's software emulation (TCG). GPUs are passed through whole by VFIO (managed
`hostdev`s, by the PCI address the inventory reported for each booked uuid).

**Running** is its readiness check answering: its HTTP port (`http_port`), its SSH server's
greeting, or the qemu guest agent's `guest-ping`, through 127.0.0.1 ports qemu forwards.

**Park** keeps the disk: a managed save where the host allows (memory to disk; resume continues
where it stopped; not with passed-through devices), else an ACPI shutdown (sent again while the
guest has not reacted; forced off after the grace). The sentence it returns says which, for the
timeline. **Resume** starts the same domain (restoring a managed save). **Remove** destroys it,
undefines it with its managed save, and deletes its directory: the disk goes only then.

**Adoption**: a restarted agent finds its running VMs by their records or, without one, by
domain name and metadata (`discover`); its console relay listens again on the same port.

Every libvirt call blocks, so each runs in a thread; the connection is opened lazily and again
after it died (libvirtd restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from einsora.agent import hostvirt
from einsora.agent.downloads import DownloadPolicy
from einsora.agent.drivers.base import Adoption, Handle, Observation, StartFailed
from einsora.agent.drivers.launch import write_secret
from einsora.agent.drivers.probe import PROBE_TIMEOUT_S, Probe, failure
from einsora.agent.drivers.vm import images
from einsora.agent.drivers.vm import plan as vmplan
from einsora.agent.drivers.vm.console import ConsoleRelay
from einsora.agent.drivers.vm.domain import DomainPlan, domain_xml, read_domain
from einsora.agent.drivers.vm.seed import write_seed
from einsora.common.schemas import (
    Confinement,
    DesiredWorkload,
    DeviceAccess,
    ObservedPhase,
    VmSpec,
    utcnow,
)

log = logging.getLogger("einsora.agent")

DOMAIN_PREFIX = "einsora-"
SHUTDOWN_RESEND_S = 3.0
"""How often an ACPI shutdown is sent again while the guest has not reacted (a guest just
restored from a managed save was seen to ignore the first one)."""
DEFAULT_MEMORY_MIB = 1024


def domain_name(workload_id: str) -> str:
    return f"{DOMAIN_PREFIX}{workload_id}"


@dataclass(frozen=True)
class VmOptions:
    """Where the libvirt driver keeps VMs and what it may use."""

    uri: str = "qemu:///system"
    vm_dir: Path = Path("/var/lib/einsora-vms")
    """VMs' disks and seeds (`<vm_dir>/<workload>/`) and imported images (`images/`); qemu runs
    as its own user, so this directory is 0711, outside the agent's 0700 data dir."""
    image_dirs: tuple[Path, ...] = ()
    """Local directories a spec's image (or kernel) may come from, besides `<vm_dir>/images`."""
    kvm: bool | None = None
    """None: decided from the host (`kvm.available`)."""
    sysfs: Path = Path("/sys")
    machine_id: str = ""
    poll_s: float = 1.0
    starting_poll_s: float = 0.5
    probe_timeout_s: float = PROBE_TIMEOUT_S
    gpu_addresses: Callable[[], dict[str, str]] = field(default=dict)
    """The PCI address of each of this machine's GPUs VFIO can pass through, by uuid (from its
    inventory)."""
    workdirs: Path | None = None
    """The agent's workloads directory: a VM's plan and spec are kept in its own there."""
    downloads: DownloadPolicy | None = None
    """What an image's download may reach and bring (the machine owner's settings); None:
    public addresses only, within the default cap."""


@dataclass
class VmHandle(Handle):
    """A running VM: its domain, its readiness check, its console relay."""

    domain: str = ""
    workdir: str = ""
    probe: Probe | None = None
    guest_agent: bool = False
    ports: dict[str, int] = field(default_factory=dict)
    park_with: str = "save"
    hostdevs: int = 0
    relay: ConsoleRelay | None = None


def _libvirt() -> Any:
    try:
        import libvirt
    except ImportError:
        raise StartFailed(
            "libvirt-python is not installed beside the agent: pip install "
            "'einsora-agent[libvirt]' on this machine (it needs libvirt-dev to build)"
        ) from None
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors are raised, not printed
    return libvirt


class _NoLibvirt(Exception):
    """Stands for libvirt's error where libvirt-python is not installed (nothing raises it)."""


def _libvirt_error() -> Any:
    """libvirt's error class, for `except` clauses that must work without libvirt-python."""
    try:
        import libvirt
    except ImportError:
        return _NoLibvirt
    return libvirt.libvirtError


class LibvirtDriver:
    """Runs `vm` workloads as libvirt domains."""

    name = "libvirt"

    def __init__(self, options: VmOptions | None = None) -> None:
        self.options = options or VmOptions()
        self._conn: Any = None

    # --- libvirt ------------------------------------------------------------------------

    def connection(self) -> Any:
        """The open connection (blocking; opened again when it died)."""
        libvirt = _libvirt()
        if self._conn is not None:
            try:
                if self._conn.isAlive():
                    return self._conn
            except libvirt.libvirtError:
                pass
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
            self._conn = None
        try:
            self._conn = libvirt.open(self.options.uri)
        except libvirt.libvirtError as exc:
            raise StartFailed(
                f"libvirt at {self.options.uri} does not answer: {exc.get_error_message()}"
            ) from None
        return self._conn

    def _lookup(self, name: str) -> Any:
        libvirt = _libvirt()
        try:
            return self.connection().lookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise StartFailed(f"libvirt: {exc.get_error_message()}") from None

    def _uses_kvm(self) -> bool:
        return (
            self.options.kvm
            if self.options.kvm is not None
            else hostvirt.available(self.options.sysfs)
        )

    # --- start --------------------------------------------------------------------------

    async def start(self, workload: DesiredWorkload, workdir: Path | None) -> Handle:
        if workdir is None:
            raise StartFailed("the libvirt driver needs a working directory")
        spec = vmplan.read_spec(workload.spec)
        if spec.image is None:
            raise StartFailed(
                "a vm needs spec.image: the path or https URI of a qcow2 or raw disk image"
            )
        if not workload.access_token:
            raise StartFailed("a vm needs its access token from the control plane; none came")
        name = domain_name(workload.workload_id)
        dom = await asyncio.to_thread(self._lookup, name)
        if dom is not None and await asyncio.to_thread(dom.isActive):
            record = await asyncio.to_thread(self._record_of_domain, dom)
            if record is not None:
                adopted = await self.adopt(record)
                if adopted.handle is not None:
                    return adopted.handle
        try:
            await asyncio.to_thread(workdir.mkdir, mode=0o700, parents=True, exist_ok=True)
            write_secret(workdir / "token", workload.access_token)
            write_secret(workdir / "spec.json", spec.model_dump_json())
            plan = await self._plan(workload, spec, workdir, dom)
        except OSError as exc:
            raise StartFailed(f"could not prepare the VM: {exc}") from exc
        # Looked up again: making the plan may have undefined a domain it could not use.
        dom = await asyncio.to_thread(self._lookup, name)
        began = time.monotonic()
        try:
            dom, restored = await asyncio.to_thread(self._define_and_start, plan, dom)
        except _libvirt_error() as exc:
            raise StartFailed(
                f"libvirt could not start the VM: {exc.get_error_message()}"
            ) from None
        log.info(
            "vm started",
            extra={
                "workload": workload.workload_id,
                "domain": name,
                "restored": restored,
                "kvm": plan.kvm,
                "seconds": round(time.monotonic() - began, 2),
            },
        )
        handle = VmHandle(
            workload_id=workload.workload_id,
            started_at=utcnow(),
            domain=name,
            workdir=str(workdir),
            probe=vmplan.probe_of(spec, plan.ports),
            guest_agent=spec.readiness_kind == "agent",
            ports=dict(plan.ports),
            park_with=spec.park,
            hostdevs=len(plan.hostdevs),
            endpoint=vmplan.endpoint_of(plan.ports),
            devices=DeviceAccess(gpus=list(workload.resources.gpus), confinement=Confinement.vm),
        )
        await self._relay(handle)
        return handle

    async def _plan(
        self, workload: DesiredWorkload, spec: VmSpec, workdir: Path, dom: Any
    ) -> DomainPlan:
        """The domain plan: the one kept from before (parked) with its ports checked, or a
        new one with its disk, seed and ports made now."""
        saved = workdir / "vm.json"
        if dom is not None and saved.exists():
            plan = vmplan.load_plan(saved)
            if all(vmplan.port_free(p) for p in plan.ports.values()):
                return plan
            # A port it had was taken while it was parked: new ports (a managed save cannot
            # change its devices' arguments, so it boots afresh).
            log.warning(
                "a port of a parked vm was taken; it boots afresh on new ports",
                extra={"workload": workload.workload_id, "ports": plan.ports},
            )
            plan = vmplan.with_ports(plan, vmplan.pick_ports(spec))
            await asyncio.to_thread(vmplan.drop_managed_save, dom)
            vmplan.save_plan(saved, plan)
            return plan
        if dom is not None:  # defined, but its plan is gone: start from scratch
            await asyncio.to_thread(self._undefine, dom)
        vm_dir = self.options.vm_dir / workload.workload_id
        await asyncio.to_thread(vmplan.make_vm_dir, self.options.vm_dir, vm_dir)
        allowed = (*self.options.image_dirs, self.options.vm_dir / "images")
        downloads = self.options.vm_dir / "images" / "downloads"
        assert spec.image is not None
        source = await images.fetch(
            spec.image, "spec.image", allowed, downloads, self.options.downloads
        )
        base = await asyncio.to_thread(
            images.check_disk_image,
            source,
            spec.image_format,
            spec.image_sha256,
            self.options.vm_dir / "images",
        )
        disk = vm_dir / "disk.qcow2"
        size = None if spec.disk_gib is None else int(spec.disk_gib * 1024**3)
        await asyncio.to_thread(images.overlay, base, disk, size)
        seed = vm_dir / "seed.iso"
        await asyncio.to_thread(
            write_seed,
            seed,
            workload_id=workload.workload_id,
            hostname=workload.name or workload.workload_id,
            ssh_key=spec.ssh_key,
            given=spec.user_data,
        )
        kernel = initrd = None
        cmdline = ""
        if spec.boot is not None:
            kernel = await self._boot_file(spec.boot.kernel, "spec.boot.kernel", allowed)
            if spec.boot.initrd is not None:
                initrd = await self._boot_file(spec.boot.initrd, "spec.boot.initrd", allowed)
            cmdline = spec.boot.cmdline
        plan = DomainPlan(
            name=domain_name(workload.workload_id),
            workload_id=workload.workload_id,
            machine_id=self.options.machine_id,
            vcpus=spec.vcpus or max(1, math.ceil(workload.resources.cpus)),
            memory_mib=spec.memory_mib or workload.resources.memory_mib or DEFAULT_MEMORY_MIB,
            kvm=self._uses_kvm(),
            disk=str(disk),
            seed=str(seed),
            kernel=kernel,
            initrd=initrd,
            cmdline=cmdline,
            forwards=(),
            hostdevs=self._hostdevs(workload.resources.gpus),
        )
        plan = vmplan.with_ports(plan, vmplan.pick_ports(spec))
        vmplan.save_plan(saved, plan)
        return plan

    async def _boot_file(self, source: str, field: str, allowed: tuple[Path, ...]) -> str:
        downloads = self.options.vm_dir / "images" / "downloads"
        path = await images.fetch(source, field, allowed, downloads, self.options.downloads)
        imported = await asyncio.to_thread(
            images.import_file, path, self.options.vm_dir / "images", "boot"
        )
        return str(imported)

    def _hostdevs(self, gpus: list[str]) -> tuple[str, ...]:
        if not gpus:
            return ()
        addresses = self.options.gpu_addresses()
        missing = [g for g in gpus if g not in addresses]
        if missing:
            raise StartFailed(
                f"GPU {missing[0]} cannot be passed through to a VM here: this machine "
                "reports no PCI address and IOMMU group it may pass through for it"
            )
        return tuple(addresses[g] for g in gpus)

    def _define_and_start(self, plan: DomainPlan, dom: Any) -> tuple[Any, bool]:
        conn = self.connection()
        if dom is None:
            dom = conn.defineXML(domain_xml(plan))
        elif not dom.hasManagedSaveImage(0):
            # Redefined from the plan each cold boot, so a port moved while parked is taken.
            dom = conn.defineXML(vmplan.with_uuid(domain_xml(plan), dom.UUIDString()))
        restored = bool(dom.hasManagedSaveImage(0))
        dom.create()
        return dom, restored

    async def _relay(self, handle: VmHandle) -> None:
        token_file = Path(handle.workdir) / "token"
        token = await asyncio.to_thread(token_file.read_text)
        relay = ConsoleRelay(handle.workload_id, token.strip(), lambda: self._pty(handle.domain))
        try:
            await relay.start(handle.ports.get("console", 0))
        except OSError as exc:
            log.warning(
                "console relay could not listen; the console is unavailable",
                extra={"workload": handle.workload_id, "error": str(exc)},
            )
            return
        handle.relay = relay

    async def _pty(self, name: str) -> str | None:
        def read() -> str | None:
            dom = self._lookup(name)
            return None if dom is None else read_domain(dom.XMLDesc(0)).console_pty

        return await asyncio.to_thread(read)

    # --- observe ------------------------------------------------------------------------

    async def observe(self, handle: Handle) -> Observation:
        assert isinstance(handle, VmHandle)
        try:
            state = await asyncio.to_thread(self._state, handle.domain)
        except StartFailed as exc:
            return Observation(
                ObservedPhase.starting, exc.message, recheck_s=self.options.starting_poll_s
            )
        if state is not None:
            return Observation(ObservedPhase.failed, state)
        why = await self._readiness(handle)
        if why is None:
            return Observation(ObservedPhase.running, recheck_s=self.options.poll_s)
        return Observation(ObservedPhase.starting, why, recheck_s=self.options.starting_poll_s)

    def _state(self, name: str) -> str | None:
        """None while the domain runs, else why it does not, in words."""
        libvirt = _libvirt()
        dom = self._lookup(name)
        if dom is None:
            return f"its VM {name} is gone (undefined outside Einsora)"
        try:
            state, reason = dom.state()
        except libvirt.libvirtError as exc:
            raise StartFailed(f"libvirt: {exc.get_error_message()}") from None
        if state in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED):
            return None
        if state == libvirt.VIR_DOMAIN_PAUSED:
            return None  # e.g. a restore finishing; its readiness check says the rest
        if state == libvirt.VIR_DOMAIN_CRASHED:
            return f"its VM {name} crashed"
        if state == libvirt.VIR_DOMAIN_SHUTOFF:
            why = {
                libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN: "the guest shut itself down",
                libvirt.VIR_DOMAIN_SHUTOFF_DESTROYED: "it was forced off outside Einsora",
                libvirt.VIR_DOMAIN_SHUTOFF_CRASHED: "the guest crashed",
                libvirt.VIR_DOMAIN_SHUTOFF_FAILED: "qemu failed",
            }.get(reason, "it stopped")
            return f"its VM {name} is off: {why}"
        return None

    async def _readiness(self, handle: VmHandle) -> str | None:
        if handle.guest_agent:
            return await asyncio.to_thread(self._guest_ping, handle.domain)
        if handle.probe is None:
            return None
        return await failure(handle.probe, self.options.probe_timeout_s)

    def _guest_ping(self, name: str) -> str | None:
        libvirt = _libvirt()
        import libvirt_qemu

        dom = self._lookup(name)
        if dom is None:
            return f"its VM {name} is gone"
        try:
            libvirt_qemu.qemuAgentCommand(dom, '{"execute":"guest-ping"}', 2, 0)
        except libvirt.libvirtError as exc:
            return f"the qemu guest agent does not answer: {exc.get_error_message()}"
        return None

    # --- park, stop, remove -------------------------------------------------------------

    async def park(self, handle: Handle, grace_s: float) -> str:
        assert isinstance(handle, VmHandle)
        await self._stop_relay(handle)
        dom = await asyncio.to_thread(self._lookup, handle.domain)
        if dom is None:
            return f"(its VM {handle.domain} was already gone)"
        libvirt = _libvirt()
        note = ""
        if handle.park_with == "save" and handle.hostdevs == 0:
            began = time.monotonic()
            try:
                await asyncio.to_thread(dom.managedSave, 0)
            except libvirt.libvirtError as exc:
                note = f"a managed save failed ({exc.get_error_message()}), so it was "
            else:
                took = time.monotonic() - began
                return (
                    f"with a managed save in {took:.1f} s: its memory and disk are kept, so a "
                    "resume continues where it stopped"
                )
        elif handle.hostdevs:
            note = "it has devices passed through (no managed save), so it was "
        how = await self._shut_down(dom, grace_s)
        return f"{note}{how}"

    async def _shut_down(self, dom: Any, grace_s: float) -> str:
        libvirt = _libvirt()
        began = time.monotonic()
        sent = 0.0
        while time.monotonic() - began < grace_s:
            if not await asyncio.to_thread(dom.isActive):
                took = time.monotonic() - began
                return (
                    f"shut down (ACPI) in {took:.1f} s: its disk is kept, so a resume boots it "
                    "again"
                )
            if time.monotonic() - sent >= SHUTDOWN_RESEND_S:
                sent = time.monotonic()
                with contextlib.suppress(libvirt.libvirtError):
                    await asyncio.to_thread(dom.shutdown)
            await asyncio.sleep(0.2)
        with contextlib.suppress(libvirt.libvirtError):
            await asyncio.to_thread(dom.destroy)
        return (
            f"forced off: the guest did not shut down within {grace_s:g} s of an ACPI "
            "shutdown; its disk is kept, so a resume boots it again"
        )

    async def stop(self, handle: Handle, grace_s: float) -> None:
        assert isinstance(handle, VmHandle)
        await self._stop_relay(handle)
        libvirt = _libvirt()
        dom = await asyncio.to_thread(self._lookup, handle.domain)
        if dom is not None:
            with contextlib.suppress(libvirt.libvirtError):
                if await asyncio.to_thread(dom.isActive):
                    await asyncio.to_thread(dom.destroy)

    async def _stop_relay(self, handle: VmHandle) -> None:
        relay, handle.relay = handle.relay, None
        if relay is not None:
            await relay.stop()

    async def delete(self, workdir: Path) -> None:
        workload_id = workdir.name
        try:
            dom = await asyncio.to_thread(self._lookup, domain_name(workload_id))
            if dom is not None:
                await asyncio.to_thread(self._undefine, dom)
        except StartFailed as exc:
            raise OSError(exc.message) from None
        except _libvirt_error() as exc:
            raise OSError(f"libvirt: {exc.get_error_message()}") from None
        await asyncio.to_thread(shutil.rmtree, self.options.vm_dir / workload_id, True)
        await asyncio.to_thread(shutil.rmtree, workdir)

    def _undefine(self, dom: Any) -> None:
        libvirt = _libvirt()
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(
            libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
            | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
        )

    # --- records and adoption -----------------------------------------------------------

    def record(self, handle: Handle) -> dict[str, Any] | None:
        assert isinstance(handle, VmHandle)
        return {
            "workload_id": handle.workload_id,
            "domain": handle.domain,
            "started_at": handle.started_at.isoformat(),
            "workdir": handle.workdir,
            "probe": None if handle.probe is None else handle.probe.to_dict(),
            "guest_agent": handle.guest_agent,
            "ports": handle.ports,
            "park_with": handle.park_with,
            "hostdevs": handle.hostdevs,
            "ready": handle.ready,
        }

    async def adopt(self, record: dict[str, Any]) -> Adoption:
        try:
            ports = {str(k): int(v) for k, v in dict(record.get("ports") or {}).items()}
            handle = VmHandle(
                workload_id=str(record["workload_id"]),
                started_at=datetime.fromisoformat(str(record["started_at"])),
                domain=str(record["domain"]),
                workdir=str(record["workdir"]),
                probe=None if record.get("probe") is None else Probe.from_dict(record["probe"]),
                guest_agent=record.get("guest_agent") is True,
                ports=ports,
                park_with=str(record.get("park_with", "save")),
                hostdevs=int(record.get("hostdevs", 0)),
                ready=record.get("ready") is True,
                endpoint=vmplan.endpoint_of(ports),
            )
        except (KeyError, TypeError, ValueError) as exc:
            return Adoption(None, f"its record could not be read ({exc})")
        try:
            dom = await asyncio.to_thread(self._lookup, handle.domain)
            active = dom is not None and await asyncio.to_thread(dom.isActive)
        except StartFailed as exc:
            return Adoption(None, f"its VM could not be looked at: {exc.message}")
        if not active:
            return Adoption(None, f"its VM {handle.domain} stopped while the agent was not running")
        await self._relay(handle)
        return Adoption(handle)

    async def discover(self, machine_id: str) -> dict[str, dict[str, Any]]:
        try:
            return await asyncio.to_thread(self._discover, machine_id)
        except StartFailed as exc:  # no libvirt here (the inventory says why): no VMs either
            log.debug("no VMs to find", extra={"error": exc.message})
            return {}
        except _libvirt_error() as exc:
            log.warning("running VMs could not be listed", extra={"error": str(exc)})
            return {}

    def _discover(self, machine_id: str) -> dict[str, dict[str, Any]]:
        libvirt = _libvirt()
        found: dict[str, dict[str, Any]] = {}
        flags = libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
        for dom in self.connection().listAllDomains(flags):
            if not dom.name().startswith(DOMAIN_PREFIX):
                continue
            record = self._record_of_domain(dom)
            if record is not None and record.pop("machine_id") == machine_id:
                found[str(record["workload_id"])] = record
        return found

    def _record_of_domain(self, dom: Any) -> dict[str, Any] | None:
        """A record made from a running domain's metadata and its saved plan."""
        facts = read_domain(dom.XMLDesc(0))
        if facts.workload_id is None:
            return None
        workdirs = self.options.workdirs
        workdir = None if workdirs is None else workdirs / facts.workload_id
        spec = None if workdir is None else vmplan.load_spec(workdir / "spec.json")
        probe = None if spec is None else vmplan.probe_of(spec, facts.ports)
        return {
            "workload_id": facts.workload_id,
            "machine_id": facts.machine_id,
            "domain": dom.name(),
            "started_at": utcnow().isoformat(),
            "workdir": "" if workdir is None else str(workdir),
            "probe": None if probe is None else probe.to_dict(),
            "ports": facts.ports,
            "hostdevs": facts.hostdevs,
            "guest_agent": spec is not None and spec.readiness_kind == "agent",
            "park_with": "save" if spec is None else spec.park,
            "ready": True,
        }
