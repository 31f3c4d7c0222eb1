"""A VM's images (its disk image, a kernel and an initrd for a direct boot): found, checked and
imported into the libvirt driver's own directory before any VM uses them.

**Where an image may come from.** An `https://` URI is downloaded (`einsora.agent.downloads`:
public addresses unless the machine's owner allows a network, within the owner's cap for VM
images, streamed to a partial file and renamed once complete). A local path (or `file://` URI)
must lie, links resolved, in a directory the machine's owner allows (`VmOptions.image_dirs`) or
in the driver's own `images/`: a VM's disk is read by qemu, so a guest naming `/etc/shadow` as
its "raw image" would otherwise read the host's files.

**What is checked.** `qemu-img info` with the format forced when the spec names one: only qcow2
or raw; no backing file (a qcow2 that points at another file would read it); not encrypted; a
size. With `image_sha256`, the file's digest. A refusal is a StartFailed naming the check.

**Importing.** A checked image is copied once into `<vm_dir>/images/` (0644: qemu runs as its
own user and must read it; the source may sit where that user cannot reach), named by a digest
of its source path, size and modification time, so the next VM from it starts at once. Each VM
then gets a copy-on-write qcow2 over the imported image (`overlay`): the image itself is never
written.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from einsora.agent import downloads
from einsora.agent.drivers.base import StartFailed
from einsora.common import weights

FORMATS = ("qcow2", "raw")
QEMU_IMG_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CheckedImage:
    """An image ready for VMs: its imported path, format and virtual size."""

    path: Path
    format: str
    virtual_size: int


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=QEMU_IMG_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise StartFailed(
            f"{argv[0]} is not installed on this machine (Debian: apt-get install qemu-utils)"
        ) from None
    except subprocess.TimeoutExpired:
        raise StartFailed(f"{argv[0]} {argv[1]} took over {QEMU_IMG_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise StartFailed(f"{argv[0]} {argv[1]} failed: {done.stderr.strip()[:300]}")
    return done.stdout


def local_path(source: str, field: str, allowed: tuple[Path, ...]) -> Path:
    """The real path of a local `source` (absolute path or `file://`), refused unless it lies
    in one of the `allowed` directories."""
    shown = weights.redact(source)
    if source.lower().startswith("file://"):
        parts = urlsplit(source)
        if parts.netloc not in ("", "localhost"):
            raise StartFailed(f"{field} {shown} names a file on another host ({parts.netloc})")
        path = Path(unquote(parts.path))
    else:
        path = Path(source)
    if not path.is_absolute():
        raise StartFailed(
            f"{field} {shown} is a relative path; give an absolute path on the machine, a "
            "file:// or an https:// URI"
        )
    real = Path(os.path.realpath(path))
    for directory in allowed:
        root = Path(os.path.realpath(directory))
        if real == root or root in real.parents:
            if not real.is_file():
                raise StartFailed(f"{field} {shown}: no such file on this machine")
            return real
    where = ", ".join(str(d) for d in allowed) or "none"
    raise StartFailed(
        f"{field} {shown} is outside the directories this machine's owner allows VM images "
        f"from ({where}); its owner adds one with `einsora agent --vm-images DIR`, or give an "
        "https:// URI"
    )


async def fetch(
    source: str,
    field: str,
    allowed: tuple[Path, ...],
    downloaded: Path,
    policy: downloads.DownloadPolicy | None = None,
) -> Path:
    """The local file of `source`: a path in an allowed directory, or a download into
    `downloaded` (as the machine owner's `policy` allows: by default, public addresses only)."""
    scheme = source.split("://", 1)[0].lower() if "://" in source else ""
    if scheme == "https":
        policy = policy or downloads.DownloadPolicy()
        return await downloads.download(source, downloaded, policy.image_cap, policy)
    if scheme not in ("", "file"):
        raise StartFailed(
            f"{field} {weights.redact(source)}: {scheme}:// is not supported; give an absolute "
            "path, a file:// or an https:// URI"
        )
    return await asyncio.to_thread(local_path, source, field, allowed)


def info(path: Path, expected: str | None, field: str) -> tuple[str, int]:
    """`qemu-img info` of `path`: its format and virtual size, or StartFailed naming the
    check it fails."""
    argv = ["qemu-img", "info", "--output=json"]
    if expected is not None:
        argv += ["-f", expected]  # never let a raw image be probed as something else
    described = json.loads(_run([*argv, str(path)]))
    fmt = str(described.get("format", ""))
    if fmt not in FORMATS:
        raise StartFailed(f"{field} is a {fmt or 'unknown'} image; only qcow2 or raw are taken")
    if expected is not None and fmt != expected:
        raise StartFailed(f"{field} is {fmt}, not the {expected} its spec names")
    if described.get("backing-filename") or described.get("full-backing-filename"):
        raise StartFailed(
            f"{field} has a backing file; give a standalone image (qemu-img convert -O qcow2)"
        )
    if described.get("encrypted"):
        raise StartFailed(f"{field} is encrypted; give an unencrypted image")
    size = int(described.get("virtual-size") or 0)
    if size <= 0:
        raise StartFailed(f"{field} has no size")
    return fmt, size


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _import_name(path: Path, suffix: str) -> str:
    stat = path.stat()
    key = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    return f"{hashlib.sha256(key).hexdigest()[:24]}.{suffix}"


def import_file(path: Path, images: Path, suffix: str) -> Path:
    """`path` copied into `images` (0644) once, or the copy already there."""
    images.mkdir(mode=0o711, parents=True, exist_ok=True)
    if path.parent == images:
        return path
    target = images / _import_name(path, suffix)
    if not target.exists():
        partial = images / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
        try:
            shutil.copyfile(path, partial)
            partial.chmod(0o644)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return target


def check_disk_image(
    path: Path, expected_format: str | None, sha256: str | None, images: Path
) -> CheckedImage:
    """Check `path` as a VM disk image and import it (blocking: run it in a thread)."""
    fmt, size = info(path, expected_format, "spec.image")
    if sha256 is not None and sha256_of(path) != sha256:
        raise StartFailed("spec.image does not have the SHA-256 its spec names (image_sha256)")
    imported = import_file(path, images, fmt)
    return CheckedImage(imported, fmt, size)


def overlay(base: CheckedImage, disk: Path, size_bytes: int | None) -> None:
    """The VM's own disk: a qcow2 over `base`, grown to `size_bytes` when that is larger."""
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", base.format, "-b", str(base.path)]
    argv.append(str(disk))
    if size_bytes is not None and size_bytes > base.virtual_size:
        argv.append(str(size_bytes))
    _run(argv)
    disk.chmod(0o600)
