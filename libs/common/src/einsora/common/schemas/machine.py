"""Machine values in the `machines` bucket: desired state, observed state, inventory.

Desired state is level-triggered: the complete set of workloads a machine should have, with a
generation number, never a diff. Observed state is likewise complete.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator

from einsora.common.schemas.base import Message, utcnow
from einsora.common.vocab import WorkloadKind


class Target(StrEnum):
    """What the agent should make of a workload it is told about."""

    running = "running"
    parked = "parked"
    """Stopped, its working directory kept, its devices released."""
    removed = "removed"
    """Stopped and its working directory deleted."""


class Resources(Message):
    """What a workload is given on a machine: whole GPUs (by uuid), cores, memory."""

    gpus: list[str] = Field(default_factory=list)
    cpus: float = 0
    memory_mib: int = 0


class DesiredWorkload(Message):
    """One workload in a machine's desired state."""

    workload_id: str
    tenant_id: str
    kind: WorkloadKind
    class_name: str
    target: Target
    name: str = ""
    """The workload's name; an endpoint serves its model under it."""
    spec: dict[str, Any] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    access_token: str | None = None
    """The workload's own token (e.g. Jupyter's), made by the control plane; never in a URL."""
    traceparent: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """The trace of the request that last acted on it (tracing on): the agent's driver action
    joins it. Left out of the value when None, so a scheduler without tracing writes what it
    always did."""
    request_id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    """That request's ID, for the agent's spans and logs (sent with `traceparent` only)."""
    driver: str | None = None
    """The driver the scheduler chose for it on this machine (`process`, `docker`, `libvirt`,
    …); None: the agent's own default (desired states from before drivers were chosen)."""
    replaceable: bool = Field(default=False, exclude_if=lambda v: not v)
    """The control plane may run it elsewhere once this machine is lost (it has a fallback
    chain, or it is one of an endpoint's replicas): cut off from the bus for
    `agent_fence_after_s`, its agent stops it, unless its spec says `disconnect: keep`
    (ADR-0029). Left out of the value when False, so other workloads' entries are as before."""


class DesiredState(Message):
    """`<machine>.desired`: everything the machine should have, at `generation`."""

    machine_id: str
    generation: int = Field(ge=0)
    workloads: list[DesiredWorkload] = Field(default_factory=list)
    at: datetime = Field(default_factory=utcnow)


class ObservedPhase(StrEnum):
    """A workload's phase as the agent sees it."""

    starting = "starting"
    running = "running"
    stopping = "stopping"
    parked = "parked"
    failed = "failed"
    removed = "removed"


class Endpoint(Message):
    """Where a running workload answers, from the agent's machine."""

    host: str = Field(max_length=255)
    port: int = Field(ge=1, le=65535)
    runtime: str | None = Field(default=None, max_length=32)
    """What serves an endpoint there (`EndpointRuntime`, or `sim` when simulated): the gateway
    counts tokens by it."""
    ports: dict[Annotated[str, Field(max_length=32)], Annotated[int, Field(ge=1, le=65535)]] = (
        Field(default_factory=dict, max_length=8)
    )
    """Its other ports on `host`, by what they carry: a VM's `ssh` and `console` (its serial
    console's relay) and, when it serves one, `http` (then also `port`)."""


class Confinement(StrEnum):
    """How a workload is held to the devices it was given, beyond what it is told."""

    cgroup2 = "cgroup2"
    """A cgroup v2 device program lets its processes open only its own GPUs' device nodes."""
    cgroup1 = "cgroup1"
    """The cgroup v1 device controller denies its processes every other GPU's device nodes."""
    container = "container"
    """A container given exactly its devices (NVIDIA's container toolkit)."""
    vm = "vm"
    """A VM given exactly its devices (VFIO passthrough)."""
    sim = "sim"
    """Nothing runs (the sim driver): what a real driver would have given it."""


class DeviceAccess(Message):
    """What a driver gave a workload of its machine's GPUs, as the workload sees them."""

    gpus: list[str] = Field(default_factory=list)
    """The GPU (or MIG slice) uuids it sees (its `CUDA_VISIBLE_DEVICES`); []: none at all."""
    confinement: Confinement | None = None
    """How it is held to them; None: by its environment only (it could open other devices)."""


class ObservedWorkload(Message):
    """One workload as the agent observes it."""

    workload_id: str
    phase: ObservedPhase
    reason: str = ""
    pid: int | None = None
    started_at: datetime | None = None
    endpoint: Endpoint | None = None
    devices: DeviceAccess | None = Field(default=None, exclude_if=lambda v: v is None)
    """The devices its driver gave it, while it has a process (None: none, or not said)."""


class ObservedState(Message):
    """`<machine>.observed`: what the machine runs and which desired generation it applied."""

    machine_id: str
    generation_applied: int = Field(ge=0)
    heartbeat_at: datetime = Field(default_factory=utcnow)
    workloads: list[ObservedWorkload] = Field(default_factory=list)


class GpuHealth(StrEnum):
    """A GPU's health; a quarantined one is never given to a workload."""

    ok = "ok"
    quarantined = "quarantined"


class Gpu(Message):
    """One GPU, or one MIG slice of a GPU, in an inventory.

    A GPU in MIG mode is listed whole (`mig_mode`, never given out as it is) and each of its
    slices beside it (`mig`, with its profile and its parent's uuid), each a device of its own.
    """

    NOTE_MAX: ClassVar[int] = 1024

    index: int
    uuid: str = Field(max_length=128)
    model: str = Field(max_length=128)
    """As NVML names it (`NVIDIA H200`; a slice: `NVIDIA H200 MIG 1g.18gb`)."""
    memory_mib: int
    mig: bool = False
    """A MIG slice: a device of its own, carved from `parent_uuid`."""
    mig_profile: str | None = Field(default=None, max_length=32)
    """A slice's profile (`1g.18gb`, `3g.71gb`)."""
    parent_uuid: str | None = Field(default=None, max_length=128)
    """A slice's GPU."""
    mig_mode: bool = False
    """A whole GPU in MIG mode: only its slices are given out, never the GPU whole."""
    device_numbers: list[Annotated[str, Field(max_length=16)]] = Field(
        default_factory=list, max_length=8
    )
    """The device nodes (`major:minor`) a workload given it must open besides the driver's
    shared ones: `/dev/nvidia<N>` (a slice: its GPU's) and a slice's MIG capability nodes.
    [] where unknown (not Linux, or not read)."""
    health: GpuHealth = GpuHealth.ok
    pci_address: str | None = Field(default=None, max_length=32)
    """Its PCI address (`0000:65:00.0`), where the machine reports it."""
    iommu_group: int | None = None
    """Its IOMMU group; None: no IOMMU (or not reported), so no passthrough."""
    passthrough: bool = False
    """Whether a VM can be given it whole through VFIO (`passthrough_note` says why not)."""
    passthrough_note: str = Field(default="", max_length=NOTE_MAX)
    """Cut at `NOTE_MAX` characters: it may quote an error."""

    @field_validator("passthrough_note", mode="before")
    @classmethod
    def _cut_note(cls, value: object) -> object:
        return value[: cls.NOTE_MAX] if isinstance(value, str) else value


class Virtualization(StrEnum):
    """How the libvirt driver runs VMs on a machine."""

    kvm = "kvm"
    """Hardware virtualization (the `kvm_intel` or `kvm_amd` module is loaded)."""
    emulated = "emulated"
    """Software emulation (qemu's TCG): much slower, but it boots anywhere."""


class DriverReport(Message):
    """What an agent found of one driver's engine: whether it is there, and the facts that
    decide what the scheduler may give it. The isolation it gives is the catalog's to say."""

    DETAIL_MAX: ClassVar[int] = 1024

    name: str = Field(max_length=32)
    available: bool
    detail: str = Field(default="", max_length=DETAIL_MAX)
    """In words: the engine's version and address, or why it is not available (cut at
    `DETAIL_MAX` characters: it may quote an engine's error)."""
    virtualization: Virtualization | None = None
    """libvirt: KVM or software emulation."""
    runtimes: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, max_length=16
    )
    """docker: the OCI runtimes the engine has (`runc`, `kata`, `nvidia`, …)."""
    gpus: bool = False
    """Whether it can give workloads GPUs (VFIO passthrough; NVIDIA's container toolkit)."""

    @field_validator("detail", mode="before")
    @classmethod
    def _cut_detail(cls, value: object) -> object:
        return value[: cls.DETAIL_MAX] if isinstance(value, str) else value


class DeviceConfinement(Message):
    """Whether, and how, the `process` driver confines workloads' device nodes on a machine."""

    method: Confinement | None = None
    """`cgroup2` or `cgroup1`; None: not confined (`note` says why)."""
    note: str = ""
    """Why not, in words an operator can act on ("" when confined)."""


class Inventory(Message):
    """`<machine>.inventory`: what the machine has and what Einsora may use.

    Bounded (issue 34, N7): what a machine says of itself is read by the scheduler and the api,
    so its lists and texts have limits (a machine of 16 GPUs in MIG mode lists 128 devices) and
    a value over `MAX_BYTES` is refused before it is parsed.
    """

    MAX_BYTES: ClassVar[int] = 256 * 1024

    machine_id: str = Field(max_length=128)
    region: str = Field(max_length=64)
    hostname: str = Field(max_length=255)
    os: str = Field(max_length=64)
    arch: str = Field(max_length=32)
    cpus: int
    memory_mib: int
    gpus: list[Gpu] = Field(default_factory=list, max_length=256)
    apple_chip: str | None = Field(default=None, max_length=64)
    unified_memory_mib: int | None = None
    drivers: list[Annotated[str, Field(max_length=32)]] = Field(default_factory=list, max_length=16)
    """The drivers it can run workloads with now (an engine that is not reachable is not
    listed; `engines` says why)."""
    engines: list[DriverReport] = Field(default_factory=list, max_length=16)
    """What it found of each engine-backed driver (libvirt, docker), reachable or not."""
    runtimes: list[Annotated[str, Field(max_length=32)]] = Field(
        default_factory=list, max_length=16
    )
    """Endpoint runtimes this machine can serve (`EndpointRuntime` values); the sim driver
    simulates them all."""
    device_confinement: DeviceConfinement | None = None
    """Whether the `process` driver holds workloads to their own GPUs' device nodes here; None:
    the agent does not say (the sim driver, or an agent older than this field)."""
    agent_version: str = Field(default="", max_length=64)
    reclaimed_at: datetime | None = None
    """When the owner reclaimed the machine on the machine itself (`einsora agent reclaim`,
    which works while the control plane is unreachable); None: not reclaimed there."""
    at: datetime = Field(default_factory=utcnow)


class SharingLevel(StrEnum):
    """Who may use a machine besides its owner's tenant."""

    private = "private"
    invite_only = "invite-only"
    community = "community"


class Lend(Message):
    """What a machine's owner lends Einsora of its inventory; the rest stays the owner's.

    A field left None lends all of that resource: all its cores, all its memory, every GPU.
    The scheduler gives workloads at most this, the owner's own included (ADR-0017).
    """

    cpus: float | None = Field(default=None, gt=0)
    """Cores Einsora may use in total, at most the inventory's."""
    memory_mib: int | None = Field(default=None, gt=0)
    """Memory Einsora may use in total, at most the inventory's."""
    gpus: list[str] | None = None
    """The GPUs (by uuid) Einsora may use; `[]`: none of them."""

    @property
    def everything(self) -> bool:
        return self.cpus is None and self.memory_mib is None and self.gpus is None

    def usable(self, inventory: Inventory) -> Resources:
        """The inventory narrowed by this lend: what Einsora may give workloads there now
        (healthy GPUs only; a lent uuid the machine does not report is not there to give)."""
        lent = None if self.gpus is None else set(self.gpus)
        return Resources(
            gpus=[
                g.uuid
                for g in sorted(inventory.gpus, key=lambda g: g.index)
                if g.health is GpuHealth.ok and (lent is None or g.uuid in lent)
            ],
            cpus=inventory.cpus if self.cpus is None else min(float(inventory.cpus), self.cpus),
            memory_mib=(
                inventory.memory_mib
                if self.memory_mib is None
                else min(inventory.memory_mib, self.memory_mib)
            ),
        )


class Enrolment(Message):
    """`enrolments/<machine>`: what the control plane decided when the machine joined.

    The machine's owner, region and sharing level come from here, never from its inventory.
    A revoked machine keeps its record (with `revoked_at`), so nothing it reports is taken again.
    """

    machine_id: str
    owner_tenant_id: str
    owner_user_id: str | None = None
    region: str
    sharing: SharingLevel = SharingLevel.private
    guests: list[str] = Field(default_factory=list)
    """Tenants invited to use it (accepted, not revoked); they count while `sharing` is not
    private."""
    guest_users: list[str] = Field(default_factory=list)
    """Users (ids) invited to use it, whatever tenant they launch in (accepted, not revoked);
    they count like `guests`."""
    tunnel: bool = False
    """Its workloads are reached through the tunnel its agent dials (it accepts no inbound
    connection); False: directly, at `address`."""
    tunnel_key: str | None = None
    """The agent's SSH public key (OpenSSH format): the tunnel hub knows the machine by it."""
    address: str | None = Field(default=None, max_length=255)
    """Where the control plane reaches a direct machine (`tunnel` False): its workloads' routes
    point there, whatever its agent reports (ADR-0026). The control plane's own machines are at
    `127.0.0.1`; a machine that joined directly, at the address it was enrolled with. None: no
    direct route is written for it."""
    reclaim_grace_s: float = Field(default=120.0, ge=0)
    """How long guests' workloads keep running after the owner reclaims the machine."""
    guest_min_runtime_s: float = Field(default=600.0, ge=0)
    """A guest's workload is never preempted before it has run this long."""
    reclaimed_at: datetime | None = None
    """When its owner reclaimed it through the api (None: not reclaimed, or released)."""
    lend: Lend | None = None
    """What Einsora may use of its inventory; None: all of it (as before there was a lend)."""
    enrolled_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class LeaderLease(Message):
    """`_leader.<region>.term` and `.heartbeat` in `machines`: which scheduler leads a region's
    scheduling, in which term (ADR-0021). `released`: its holder stopped cleanly, so a standby
    may take over at once."""

    region: str
    holder: str
    term: int = Field(ge=1)
    at: datetime = Field(default_factory=utcnow)
    released: bool = False
