"""The data dir is private: 0700, and what lies in it 0600 (issue 9, hole 5).

It holds the store (token hashes, every tenant's workloads), bus credentials, the owner's
token and the agents' records. A local user must read none of it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def make_private(data_dir: Path) -> None:
    """Make `data_dir` (0700) if needed; tighten what is already in it, one level deep.

    Subdirectories become 0700, which closes everything below them; files at the top become
    0600. Only what we own is changed (a shared mount may hold others' files).
    """
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    uid = os.geteuid()
    for path in (data_dir, *data_dir.iterdir()):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            info = path.lstat()
            if info.st_uid != uid or stat.S_ISLNK(info.st_mode):
                continue
            wanted = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
            if stat.S_IMODE(info.st_mode) & ~wanted:
                os.chmod(path, stat.S_IMODE(info.st_mode) & wanted)


def write_private(path: Path, text: str) -> None:
    """Write `path` (0600, its directory 0700) whole: written aside, then renamed over it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(partial, path)
