"""What the engine tests run, built here from Debian packages and cached: a tiny VM guest and a
tiny container image.

**The guest** is a Debian kernel (`apt-get download` of the one `linux-image-amd64` points at,
unpacked with `dpkg-deb -x`), an initramfs of `busybox-static`, `dropbear` (with the libraries
it links) and the virtio, ext4, isofs and ACPI button modules, and a small ext4 data disk
(qcow2). Its `/init` brings up the network qemu's user mode gives it (10.0.2.15), mounts the
data disk on `/data` and the NoCloud seed (label `cidata`) on `/seed`, takes the SSH keys the
seed names for root, and runs dropbear on port 22 (keys only; its host key made at build), then
`httpd -p 8888` (serving `/data/www` when there is one), `acpid` (the power button syncs and
powers off) and a shell on the serial console. It boots under TCG in seconds.

**The container image** is a root file system of `busybox-static` and the host's own Python 3
(its binary, the libraries it links and its standard library, tests and tools left out) with
`openai_stub.py`: a stdlib-only server that answers OpenAI's chat completions API with counted
tokens. Imported from a tarball (`docker import`), so no registry is needed.

Everything is cached under one directory (`EINSORA_ENGINES_CACHE`, default
`~/.cache/einsora-engines`), keyed by the kernel package and a hash of what this module
writes, so a second run builds nothing. It imports no test framework: the tests, the bench and
a person at a shell use it alike.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

GUEST_HTTP_PORT = 8888
GUEST_MODULES = (
    "virtio_pci",
    "virtio_blk",
    "virtio_net",
    "virtio_console",
    "virtio_rng",
    "crc32c_generic",
    "ext4",
    "isofs",
    "button",
    "evdev",
)
"""Kernel modules the guest loads (their dependencies come along, in order)."""
BUILD_VERSION = "6"
"""Bumped when what is built changes in a way the hashes below do not see."""


def cache_dir() -> Path:
    """Where built guests and images are kept between runs."""
    configured = os.environ.get("EINSORA_ENGINES_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "einsora-engines"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _run(*argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return str(done.stdout)


INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /tmp /data /seed /run /var/log /etc/dropbear
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
while read -r m; do insmod "/lib/modules/$m" 2>/dev/null; done < /modules.order
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vda ] && break; sleep 0.5; done
mount -t ext4 /dev/vda /data || echo "einsora-guest: no data disk on /dev/vda"
for dev in /dev/vd[b-z]; do
  [ -b "$dev" ] || continue
  mount -t iso9660 -o ro "$dev" /seed 2>/dev/null || continue
  [ -f /seed/meta-data ] && break
  umount /seed
done
if [ -f /seed/meta-data ]; then
  grep -ho 'ssh-[a-z0-9-]* [A-Za-z0-9+/=]*' /seed/meta-data /seed/user-data \
    > /root/.ssh/authorized_keys 2>/dev/null
  chmod 600 /root/.ssh/authorized_keys
fi
/usr/sbin/dropbear -s -g -p 22
www=/www
[ -d /data/www ] && www=/data/www
httpd -p 8888 -h "$www"
acpid -c /etc/acpi
echo "einsora-guest: ready"
while true; do setsid cttyhack sh -l; done
"""

POWER_OFF = """#!/bin/sh
sync
umount /data
poweroff -f
"""

PASSWD = "root:x:0:0:root:/root:/bin/sh\n"  # noqa: S105 - /etc/passwd, no password in it
GROUP = "root:x:0:\n"


@dataclass(frozen=True)
class TinyGuest:
    """A bootable guest: direct kernel boot of `kernel` and `initrd`, its data disk `disk`."""

    kernel: Path
    initrd: Path
    disk: Path
    cmdline: str = "console=ttyS0 quiet panic=-1"
    http_port: int = GUEST_HTTP_PORT


def _kernel_package() -> str:
    out = _run("apt-cache", "depends", "--no-recommends", "--no-suggests", "linux-image-amd64")
    found = re.findall(r"Depends: (linux-image-[0-9][^\s]*-amd64)\b", out)
    if not found:
        raise RuntimeError(f"apt-cache names no kernel behind linux-image-amd64: {out[:200]}")
    return str(found[0])


def kernel_tree(cache: Path, package: str) -> tuple[Path, str]:
    """The unpacked kernel package (`boot/`, `lib/modules/`) and its release."""
    tree = cache / "kernel" / package
    if not (tree / ".done").exists():
        work = cache / "kernel" / f".{package}.partial"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        _run("apt-get", "download", "-q", package, cwd=work)
        deb = next(work.glob("*.deb"))
        _run("dpkg-deb", "-x", str(deb), str(work / "root"))
        deb.unlink()
        shutil.rmtree(tree, ignore_errors=True)
        (work / "root").rename(tree)
        shutil.rmtree(work)
        (tree / ".done").touch()
    release = next((tree / "lib" / "modules").iterdir()).name
    return tree, release


def _modules_in_order(tree: Path, release: str) -> list[str]:
    """`GUEST_MODULES` and what they depend on, each after its dependencies (paths relative
    to the release's module directory). The package has no `modules.dep` (depmod makes it at
    install time), so each module's `depends=` is read from its own `.modinfo` strings."""
    base = tree / "lib" / "modules" / release
    by_name = {p.name.split(".ko")[0].replace("-", "_"): p for p in base.rglob("*.ko")}
    ordered: list[str] = []

    def visit(name: str) -> None:
        path = by_name[name]
        rel = str(path.relative_to(base))
        if rel in ordered:
            return
        found = re.search(rb"\x00depends=([^\x00]*)\x00", path.read_bytes())
        needs = found.group(1).decode().split(",") if found and found.group(1) else []
        for need in needs:
            visit(need.replace("-", "_"))
        ordered.append(rel)

    for name in GUEST_MODULES:
        if name in by_name:  # built in when absent
            visit(name)
    return ordered


def _libraries(binary: str) -> list[Path]:
    """The shared libraries `binary` links, with the dynamic loader."""
    found = []
    for line in _run("ldd", binary).splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            found.append(Path(match.group(1)))
    return found


def _copy_into(root: Path, source: Path) -> None:
    target = root / source.relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source.resolve(), target)


def _cpio(root: Path, out: Path) -> None:
    """`root` as a gzipped newc cpio archive (what the kernel unpacks as its initramfs)."""
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    done = subprocess.run(
        [shutil.which("cpio") or "/usr/bin/cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"],
        cwd=root,
        input="\n".join([".", *names]).encode(),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cpio failed: {done.stderr.decode().strip()}")
    out.write_bytes(gzip.compress(done.stdout, compresslevel=6))


def _prune(directory: Path, keep: str) -> None:
    """Remove what an earlier build left in `directory` (another kernel, another init)."""
    if directory.is_dir():
        for old in directory.iterdir():
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def build_guest(cache: Path | None = None) -> TinyGuest:
    """The tiny guest, built once per kernel and init script, then taken from the cache."""
    cache = cache or cache_dir()
    package = _kernel_package()
    key = _digest(BUILD_VERSION, package, INIT, POWER_OFF, *GUEST_MODULES)
    out = cache / "guest" / key
    guest = TinyGuest(kernel=out / "vmlinuz", initrd=out / "initrd.gz", disk=out / "data.qcow2")
    if (out / ".done").exists():
        return guest
    tree, release = kernel_tree(cache, package)
    _prune(cache / "guest", keep=key)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    staging = out / "initramfs"
    for sub in ("bin", "etc/acpi/PWRF", "root/.ssh", "www", "lib/modules"):
        (staging / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/busybox", staging / "bin" / "busybox")
    _copy_into(staging, Path("/usr/sbin/dropbear"))
    # Its host keys made here: made in the guest under TCG they made the first login wait, and
    # this dropbear (2022.83) fails an assertion when a client asks for a key type it lacks.
    (staging / "etc" / "dropbear").mkdir(parents=True)
    for kind in ("rsa", "ecdsa", "ed25519"):
        host_key = staging / "etc" / "dropbear" / f"dropbear_{kind}_host_key"
        _run("dropbearkey", "-t", kind, "-f", str(host_key))
    for lib in _libraries("/usr/sbin/dropbear"):
        _copy_into(staging, lib)
    modules = _modules_in_order(tree, release)
    for rel in modules:
        target = staging / "lib" / "modules" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / "lib" / "modules" / release / rel, target)
    (staging / "modules.order").write_text("\n".join(modules) + "\n")
    (staging / "init").write_text(INIT)
    (staging / "init").chmod(0o755)
    (staging / "etc" / "acpi" / "PWRF" / "00000080").write_text(POWER_OFF)
    (staging / "etc" / "acpi" / "PWRF" / "00000080").chmod(0o755)
    (staging / "etc" / "passwd").write_text(PASSWD)
    (staging / "etc" / "group").write_text(GROUP)
    (staging / "etc" / "shells").write_text("/bin/sh\n")
    (staging / "root").chmod(0o700)
    (staging / "root" / ".ssh").chmod(0o700)
    (staging / "www" / "index.html").write_text("einsora tiny guest\n")
    _cpio(staging, guest.initrd)
    shutil.rmtree(staging)
    shutil.copy2(tree / "boot" / f"vmlinuz-{release}", guest.kernel)
    data = out / "data-root"
    (data / "www").mkdir(parents=True)
    (data / "www" / "index.html").write_text("einsora tiny guest, served from its data disk\n")
    raw = out / "data.raw"
    _run("mke2fs", "-q", "-F", "-t", "ext4", "-d", str(data), str(raw), "64M")
    _run("qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(guest.disk))
    raw.unlink()
    shutil.rmtree(data)
    (out / ".done").touch()
    shutil.rmtree(tree)  # 400 MB of modules: the guest holds what it needs of them
    return guest


OPENAI_STUB = r'''"""A stdlib-only OpenAI-compatible server for the engine tests: chat completions
whose text is the prompt's words counted, with exact usage; `/v1/models`; `/health`.
Port: argv[1]."""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        size = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(size) or b"{}")
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "not found"})
            return
        words = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
        text = f"{words} words, from a container"
        self._send(200, {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model", "stub"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": words, "completion_tokens": 4,
                      "total_tokens": words + 4},
        })

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
'''

_PYTHON_SKIPPED = (
    "test",
    "idlelib",
    "tkinter",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "dist-packages",
    "site-packages",
    "__pycache__",
    "turtledemo",
    "config-3.11-x86_64-linux-gnu",
)


@dataclass(frozen=True)
class ContainerRootfs:
    """A root file system tarball for `docker import`, and the tag it is imported as."""

    tarball: Path
    tag: str
    python: str = "/usr/bin/python3"
    stub: str = "/srv/openai_stub.py"


JUPYTER = "jupyter-server>=2.14,<3"
JUPYTER_WRAPPER = """#!/bin/sh
# `jupyter server ...` as the docker driver runs it, for jupyter-server in /opt/jupyter.
[ "$1" = server ] && shift
export PYTHONPATH=/opt/jupyter
exec /usr/bin/python3 -m jupyter_server "$@"
"""


def find_uv() -> str | None:
    """The uv that installs the notebook image's Jupyter (`EINSORA_UV`, else on PATH)."""
    return os.environ.get("EINSORA_UV") or shutil.which("uv")


def _jupyter_dir(cache: Path, python: Path, uv: str) -> Path:
    """jupyter-server and its dependencies for `python`, installed once into the cache with
    uv from the package index (its wheel cache makes a second build offline)."""
    target = cache / "image" / f"jupyter-{_digest(JUPYTER, str(python))}"
    if not (target / ".done").exists():
        shutil.rmtree(target, ignore_errors=True)
        _run(
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            "--target",
            str(target),
            JUPYTER,
        )
        (target / ".done").touch()
    return target


def build_container_rootfs(
    cache: Path | None = None, *, jupyter: bool = False, uv: str | None = None
) -> ContainerRootfs:
    """busybox, the host's Python 3 and the OpenAI stub as one tarball, built once; with
    `jupyter`, also jupyter-server in /opt/jupyter and a `jupyter` command (installed with
    `uv`, which is then needed)."""
    cache = cache or cache_dir()
    python = Path("/usr/bin/python3").resolve()
    stdlib = Path("/usr/lib") / python.name
    key = _digest(BUILD_VERSION, OPENAI_STUB, str(python), *_PYTHON_SKIPPED)
    name = "stub"
    extra: Path | None = None
    if jupyter:
        if uv is None:
            raise RuntimeError("building the notebook image needs uv (EINSORA_UV or on PATH)")
        extra = _jupyter_dir(cache, python, uv)
        key = _digest(key, JUPYTER, JUPYTER_WRAPPER)
        name = "notebook"
    rootfs = ContainerRootfs(
        tarball=cache / "image" / f"rootfs-{name}-{key}.tar", tag=f"einsora-{name}:{key}"
    )
    if rootfs.tarball.exists():
        return rootfs
    rootfs.tarball.parent.mkdir(parents=True, exist_ok=True)
    for old in rootfs.tarball.parent.glob(f"rootfs-{name}-*.tar"):
        old.unlink()  # an earlier build's
    partial = rootfs.tarball.with_suffix(".partial")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        return None if any(p in _PYTHON_SKIPPED for p in parts) else info

    with tarfile.open(partial, "w") as tar:
        tar.add("/bin/busybox", "bin/busybox")
        for applet in ("sh", "ls", "cat", "echo", "mkdir", "sleep", "wget"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
        tar.add(str(python), "usr/bin/python3")
        for lib in _libraries(str(python)):
            tar.add(str(lib.resolve()), str(lib.relative_to("/")))
        tar.add(str(stdlib), str(stdlib.relative_to("/")), filter=keep)
        native = sorted((stdlib / "lib-dynload").glob("*.so"))
        if extra is not None:
            native += sorted(extra.rglob("*.so*"))
        for lib in native:
            for dep in _libraries(str(lib)):
                if extra is not None and extra in dep.parents:
                    continue  # bundled beside it (a wheel's .libs): found by its rpath
                name = str(dep.relative_to("/"))
                if name not in tar.getnames():
                    tar.add(str(dep.resolve()), name)
        stub = cache / "image" / "openai_stub.py"
        stub.write_text(OPENAI_STUB)
        tar.add(str(stub), "srv/openai_stub.py")
        if extra is not None:
            tar.add(
                str(extra), "opt/jupyter", filter=lambda i: None if i.name.endswith(".done") else i
            )
            wrapper = cache / "image" / "jupyter.sh"
            wrapper.write_text(JUPYTER_WRAPPER)
            wrapper.chmod(0o755)
            tar.add(str(wrapper), "usr/bin/jupyter")
        for empty in ("tmp", "data", "proc", "sys", "dev", "etc", "root"):
            info = tarfile.TarInfo(empty)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if empty == "tmp" else 0o755
            tar.addfile(info)
    partial.rename(rootfs.tarball)
    return rootfs
