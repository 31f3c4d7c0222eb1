"""Pytest fixtures of the engine tier (the `einsora-engines` plugin): a libvirt with the tiny
guest, a Docker Engine with the stub image. Each fixture skips, saying why, on a machine that
cannot run it (not root, a package missing: `bash scripts/engine-deps.sh`).

Session-wide: the daemons start once (and stop at the end, when this plugin started them);
guests and images come from the engines cache (`einsora.testing.guest`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from einsora.agent.engines import EngineOptions
from einsora.testing import engines as testing_engines
from einsora.testing import guest as testing_guest


@dataclass(frozen=True)
class LibvirtEngine:
    """A libvirt that answers, a VM directory qemu can reach, and the tiny guest."""

    uri: str
    vm_dir: Path
    guest: testing_guest.TinyGuest

    def options(self, **more: object) -> EngineOptions:
        """The agent's engine options for this libvirt (no Docker unless `more` says so)."""
        fields: dict[str, object] = {
            "libvirt_uri": self.uri,
            "vm_dir": self.vm_dir,
            "vm_images": (self.guest.disk.parent,),
            "docker": False,
        }
        fields.update(more)
        return EngineOptions(**fields)  # type: ignore[arg-type]

    def vm_spec(self, **more: object) -> dict[str, object]:
        """A spec that boots the tiny guest (direct kernel boot, TCG-sized)."""
        spec: dict[str, object] = {
            "image": str(self.guest.disk),
            "image_format": "qcow2",
            "memory_mib": 256,
            "vcpus": 1,
            "boot": {
                "kernel": str(self.guest.kernel),
                "initrd": str(self.guest.initrd),
                "cmdline": self.guest.cmdline,
            },
            "http_port": self.guest.http_port,
        }
        spec.update(more)
        return spec


@dataclass(frozen=True)
class DockerEngine:
    """A Docker Engine that answers, and the stub image it holds."""

    url: str
    rootfs: testing_guest.ContainerRootfs
    notebook: testing_guest.ContainerRootfs | None = None
    """The notebook image (the stub's, with jupyter-server); None where uv could not make it."""
    why_no_notebook: str = ""

    def options(self, **more: object) -> EngineOptions:
        fields: dict[str, object] = {"docker_host": self.url, "libvirt": False}
        fields.update(more)
        return EngineOptions(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def libvirt_engine() -> Iterator[LibvirtEngine]:
    why = testing_engines.why_no_libvirt()
    if why is not None:
        pytest.skip(why)
    guest = testing_guest.build_guest()
    started = testing_engines.start_libvirtd()
    vm_dir = Path(tempfile.mkdtemp(prefix="einsora-vms-"))
    vm_dir.chmod(0o711)  # qemu runs as its own user: it must reach the disks
    try:
        yield LibvirtEngine(testing_engines.LIBVIRT_URI, vm_dir, guest)
    finally:
        testing_engines.remove_einsora_domains(vm_dir)
        shutil.rmtree(vm_dir, ignore_errors=True)
        for daemon in reversed(started):
            daemon.stop()


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    why = testing_engines.why_no_docker()
    if why is not None:
        pytest.skip(why)
    cache = testing_guest.cache_dir()
    rootfs = testing_guest.build_container_rootfs(cache)
    uv = testing_guest.find_uv()
    notebook = None
    why_no_notebook = "uv is not installed (EINSORA_UV): it installs the image's Jupyter"
    if uv is not None:
        try:
            notebook = testing_guest.build_container_rootfs(cache, jupyter=True, uv=uv)
        except RuntimeError as exc:
            why_no_notebook = f"the notebook image could not be built: {exc}"
    url, daemon = testing_engines.start_dockerd(cache)
    try:
        testing_engines.import_image(url, rootfs)
        if notebook is not None:
            testing_engines.import_image(url, notebook)
        yield DockerEngine(url, rootfs, notebook, why_no_notebook)
    finally:
        testing_engines.remove_einsora_containers(url)
        if daemon is not None:
            daemon.stop()
