"""Real engines for the engine tests and the drivers bench: libvirtd and dockerd, started by hand.

There is no systemd here, so each daemon is started as root the way FIELD-NOTES says works:
`virtlogd -d; libvirtd -d` (unless a libvirt already answers on `qemu:///system`: then it is
used and left alone), and `dockerd` on a socket of its own with its data root in the engines
cache (so an image imported once is there the next run), unless a Docker Engine already answers
on its default socket. What this module started it stops, by the pid it started, never by name.

`why_no_libvirt()` and `why_no_docker()` say, in words a person accepts as a skip reason, why a
machine cannot run these tiers. It imports no test framework (`pytest_engines` holds the
fixtures).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from einsora.agent.drivers.container.driver import docker_url, unix_socket_refusal
from einsora.testing.guest import ContainerRootfs

LIBVIRT_URI = "qemu:///system"
LIBVIRT_SOCKET = Path("/var/run/libvirt/libvirt-sock")
DEFAULT_DOCKER = "unix:///var/run/docker.sock"
START_TIMEOUT_S = 60.0


def _tool(name: str) -> str:
    """The full path of a program (FileNotFoundError naming it when it is not installed)."""
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed (bash scripts/engine-deps.sh)")
    return found


def _missing(*programs: str) -> list[str]:
    return [p for p in programs if shutil.which(p) is None]


def why_no_libvirt() -> str | None:
    """Why this machine cannot run VMs for the tests (None: it can)."""
    if os.geteuid() != 0:
        return "the libvirt tier starts libvirtd and runs qemu:///system VMs: it needs root"
    missing = _missing("libvirtd", "virtlogd", "qemu-system-x86_64", "qemu-img", "ssh")
    if missing:
        return f"{', '.join(missing)} not installed (bash scripts/engine-deps.sh)"
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return "libvirt-python is not installed (make test-engines installs the agent's extra)"
    return None


def why_no_docker() -> str | None:
    """Why this machine cannot run containers for the tests (None: it can)."""
    if os.geteuid() != 0:
        return "the docker tier starts dockerd: it needs root"
    if unix_socket_refusal(docker_url(None), 2.0) is None:
        return None  # an engine already answers
    missing = _missing("dockerd", "containerd", "runc")
    if missing:
        return f"{', '.join(missing)} not installed (bash scripts/engine-deps.sh)"
    return None


@dataclass
class Daemon:
    """A daemon this module started: its pid, and its name for messages."""

    name: str
    pid: int
    proc: subprocess.Popen[bytes] | None = None
    """Its process object, when this process spawned it (waited for, so it is reaped)."""

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _libvirt_answers() -> bool:
    done = subprocess.run(
        [_tool("virsh"), "-c", LIBVIRT_URI, "version"], capture_output=True, timeout=30, check=False
    )
    return done.returncode == 0


def _wait(condition: object, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not callable(condition) or not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {START_TIMEOUT_S:g} s")
        time.sleep(0.1)


def _pid_of(pidfile: Path) -> int:
    return int(pidfile.read_text().strip())


def start_libvirtd() -> list[Daemon]:
    """libvirtd (and virtlogd) running: the daemons started now (none when one answered)."""
    if _libvirt_answers():
        return []
    started: list[Daemon] = []
    virtlogd_pid = Path("/var/run/virtlogd.pid")
    if not virtlogd_pid.exists() or not _alive(_pid_of(virtlogd_pid)):
        subprocess.run([_tool("virtlogd"), "-d"], check=True, timeout=30)
        _wait(virtlogd_pid.exists, "virtlogd")
        started.append(Daemon("virtlogd", _pid_of(virtlogd_pid)))
    subprocess.run([_tool("libvirtd"), "-d"], check=True, timeout=30)
    _wait(_libvirt_answers, "libvirtd")
    started.append(Daemon("libvirtd", _pid_of(Path("/var/run/libvirtd.pid"))))
    return started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start_dockerd(cache: Path) -> tuple[str, Daemon | None]:
    """A Docker Engine's URL: the machine's own when it answers, else one started now with its
    data root in `cache` (and the daemon, to stop)."""
    if unix_socket_refusal(docker_url(None), 2.0) is None:
        return docker_url(None), None
    root = cache / "docker"
    root.mkdir(parents=True, exist_ok=True)
    sock = root / "docker.sock"
    url = f"unix://{sock}"
    exec_root = Path(tempfile.gettempdir()) / "einsora-dockerd-exec"  # short: sockets live there
    log = (root / "dockerd.log").open("ab")
    proc = subprocess.Popen(
        [
            _tool("dockerd"),
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(exec_root),
            "--pidfile",
            str(root / "dockerd.pid"),
            "-H",
            url,
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    daemon = Daemon("dockerd", proc.pid, proc)
    try:
        _wait(lambda: unix_socket_refusal(url, 1.0) is None, "dockerd")
        _wait(lambda: _docker_ready(url), "dockerd's API")
    except RuntimeError:
        daemon.stop()
        raise
    return url, daemon


def _docker_ready(url: str) -> bool:
    from einsora.agent.drivers.container.driver import client

    docker_client = client(url, 10)
    try:
        docker_client.ping()
    except Exception:  # not up yet
        return False
    finally:
        docker_client.close()
    return True


def import_image(url: str, rootfs: ContainerRootfs) -> str:
    """`rootfs` imported into the engine at `url` as its tag (once: an engine that has the tag
    keeps it)."""
    import docker.errors

    from einsora.agent.drivers.container.driver import client

    docker_client = client(url, 120)
    try:
        try:
            docker_client.images.get(rootfs.tag)
        except docker.errors.ImageNotFound:
            repository, tag = rootfs.tag.split(":")
            docker_client.api.import_image(src=str(rootfs.tarball), repository=repository, tag=tag)
    finally:
        docker_client.close()
    return rootfs.tag


def remove_einsora_domains(vm_dir: Path) -> list[str]:
    """Undefine (destroying first) every `einsora-*` domain whose disk lies in `vm_dir`: what a
    failed test left behind."""
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    removed = []
    conn = libvirt.open(LIBVIRT_URI)
    try:
        for dom in conn.listAllDomains(0):
            if not dom.name().startswith("einsora-") or str(vm_dir) not in dom.XMLDesc(0):
                continue
            with contextlib.suppress(libvirt.libvirtError):
                if dom.isActive():
                    dom.destroy()
            with contextlib.suppress(libvirt.libvirtError):
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
            removed.append(dom.name())
    finally:
        conn.close()
    return removed


def remove_einsora_containers(url: str) -> None:
    """Remove every container and volume an Einsora driver made on the engine at `url`."""
    from einsora.agent.drivers.container.driver import client

    docker_client = client(url, 60)
    try:
        for container in docker_client.containers.list(
            all=True, filters={"label": "einsora.workload"}
        ):
            container.remove(force=True)
        for volume in docker_client.volumes.list(filters={"label": "einsora.workload"}):
            volume.remove(force=True)
    finally:
        docker_client.close()
