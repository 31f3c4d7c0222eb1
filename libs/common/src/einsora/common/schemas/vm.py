"""The spec of a `vm` workload, and of a notebook or endpoint that runs in a container.

A VM boots a disk image (qcow2 or raw; a local path on its machine, a `file://` or an `https://`
URI) that the agent checks before use and never writes to: the VM's own disk is a copy-on-write
layer over it, kept while the VM is parked and deleted with the workload. Cloud-init's NoCloud
seed carries `user_data` and the user's `ssh_key`. `boot` starts a kernel directly instead of
the disk's boot loader. `http_port` is the guest's port that the workload's site opens;
`readiness` says when the VM counts as running (its HTTP port answers, its SSH server greets,
or the qemu guest agent answers). `park` chooses a managed save (memory kept: resume continues
where it stopped) or a shutdown; a VM with passed-through devices is always shut down.

A notebook or endpoint whose spec names a container `image` runs in a container (the `docker`
driver): `ContainerSpec` holds the fields it reads.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from einsora.common.schemas.base import Message

SHA256 = r"^[0-9a-f]{64}$"
MAX_USER_DATA = 64 * 1024


class VmBoot(Message):
    """A direct kernel boot: `kernel` (and `initrd`) started with `cmdline`."""

    kernel: str = Field(min_length=1, max_length=4096)
    initrd: str | None = Field(default=None, min_length=1, max_length=4096)
    cmdline: str = Field(default="", max_length=2048)


class VmSpec(Message):
    """`spec` of a `vm` workload."""

    image: str | None = Field(default=None, min_length=1, max_length=4096)
    """The disk image: an absolute path on the machine (in a directory its owner allows), a
    `file://` or an `https://` URI."""
    image_format: Literal["qcow2", "raw"] | None = None
    """Its format; None: read from the image (qcow2 or raw only)."""
    image_sha256: str | None = Field(default=None, pattern=SHA256)
    """When given, the image must have this SHA-256."""
    disk_gib: float | None = Field(default=None, gt=0, le=65536)
    """The VM's disk size; None: the image's own."""
    vcpus: int | None = Field(default=None, ge=1, le=256)
    """None: the cores its class gives (at least 1)."""
    memory_mib: int | None = Field(default=None, ge=64, le=4 * 1024 * 1024)
    """None: the memory its class gives (1 GiB when it gives none)."""
    user_data: str | None = Field(default=None, max_length=MAX_USER_DATA)
    """cloud-init user data (`#cloud-config …`), given to the guest in its NoCloud seed."""
    ssh_key: str | None = Field(default=None, min_length=1, max_length=16384)
    """An SSH public key (one line), given to the guest in its NoCloud seed."""
    boot: VmBoot | None = None
    http_port: int | None = Field(default=None, ge=1, le=65535)
    """The guest's port of its web UI, opened at the workload's site."""
    ssh_port: int = Field(default=22, ge=1, le=65535)
    """The guest's SSH port, reached by `einsora ssh`."""
    readiness: Literal["http", "ssh", "agent"] | None = None
    """When it counts as running: `http` (its HTTP port answers below 500), `ssh` (its SSH
    server greets) or `agent` (the qemu guest agent answers); None: `http` with an
    `http_port`, else `ssh`."""
    readiness_path: str = Field(default="/", max_length=1024)
    park: Literal["save", "shutdown"] = "save"
    """How it parks: a managed save (where the machine allows) or an ACPI shutdown."""

    @field_validator("ssh_key")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        one_line = value is None or "\n" not in value.strip()
        if not one_line or (value is not None and not value.startswith(("ssh-", "ecdsa-"))):
            raise ValueError("an SSH public key is one line, e.g. ssh-ed25519 AAAA… you@host")
        return value

    @field_validator("readiness_path")
    @classmethod
    def _a_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError('a path starting with "/"')
        return value

    @property
    def readiness_kind(self) -> Literal["http", "ssh", "agent"]:
        if self.readiness is not None:
            return self.readiness
        return "http" if self.http_port is not None else "ssh"


class ContainerSpec(Message):
    """The fields of a notebook's or endpoint's spec that the `docker` driver reads."""

    image: str = Field(min_length=1, max_length=512)
    """An image the machine's Docker engine has (Einsora pulls nothing)."""
    command: list[str] | None = Field(default=None, min_length=1, max_length=64)
    """What the container runs (`$PORT` where its port goes); None: the image's own command
    for an endpoint, Jupyter for a notebook."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """The port it serves on inside the container; None: 8888 for a notebook, 8000 else."""
    volume_path: str = Field(default="/data", min_length=1, max_length=1024)
    """Where its own volume (kept while parked) is mounted."""
    env: dict[str, str] = Field(default_factory=dict)
    readiness_path: str | None = Field(default=None, max_length=1024)
