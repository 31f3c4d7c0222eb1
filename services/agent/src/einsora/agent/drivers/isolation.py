"""Process workloads of a root agent run as users of their own (ADR-0007).

Each such workload gets a uid that no real user has, from `FIRST_UID` on, with the group of the
same number and no other groups, and a private directory `<homes>/<uid>/` (0700, its own) for
its home, its Jupyter files and its temporary files. Its uid is kept in the agent's directory of
the workload (`<workdir>/uid`, root-only), so a restarted agent adopts the process as it is and a
resumed workload finds its files again. One book for the whole machine (`<homes>/uids.json`,
under a lock) makes sure no two workloads, of any agent on this machine, ever share a uid: a uid
is never handed out twice.

It must never let a workload reach the agent's own files: the agent's directories stay root-only,
and the agent never writes through a path inside a private directory (the workload may have
planted a link there); what has to be made there is made by the workload's own user (`runas`).
Permissions are judged from mode bits (an ACL that grants more is not seen).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import psutil

from einsora.agent.drivers.base import StartFailed

FIRST_UID: Final = 2_000_000_000
"""The first uid given to a workload. Far above login users (UID_MAX 60000), the subordinate
uids of user namespaces (login.defs SUB_UID_MAX 600100000) and systemd's container ranges (up to
1879048191), and below 2^31, which some programs cannot handle."""
UID_COUNT: Final = 100_000_000
"""How many uids the range holds (up to 2_099_999_999, clear of systemd's foreign range)."""
WORKLOAD_HOMES: Final = Path("/var/lib/einsora-workloads")
"""Where the private directories live: outside every data dir, which stays closed to them."""

R, W, X = 4, 2, 1
"""Permission bits, as in a mode's `rwx`."""


@dataclass(frozen=True)
class WorkloadUser:
    """The unprivileged user a workload runs as, and its private directory."""

    uid: int
    home: Path

    @property
    def gid(self) -> int:
        return self.uid


def first_blocked(path: str | Path, uid: int, gid: int, *, final: int = X) -> Path | None:
    """The first directory on the way to `path` (links followed) that user `uid` (group `gid`,
    no other groups) may not pass, or `path` itself when it lacks the `final` permission bits;
    None when the user may reach and use it. A part that does not exist blocks."""
    parts = deque(Path(os.path.abspath(path)).parts[1:])
    here = Path("/")
    if not _may(os.stat(here), uid, gid, X):
        return here
    links = 0
    while parts:
        name = parts.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent
            continue
        step = here / name
        try:
            st = os.lstat(step)
        except OSError:
            return step
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > 40:
                return step
            target = Path(os.readlink(step))
            if target.is_absolute():
                here = Path("/")
                parts.extendleft(reversed(target.parts[1:]))
            else:
                parts.extendleft(reversed(target.parts))
            continue
        if not _may(st, uid, gid, X if parts else final):
            return step
        here = step
    return None


def _may(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    if st.st_uid == uid:
        mode = st.st_mode >> 6
    elif st.st_gid == gid:
        mode = st.st_mode >> 3
    else:
        mode = st.st_mode
    return mode & bits == bits


def describe(path: Path) -> str:
    """`/root (drwx------, owner uid 0)`, for a reason a person reads."""
    try:
        st = os.lstat(path)
    except OSError:
        return f"{path} (missing)"
    return f"{path} ({stat.filemode(st.st_mode)}, owner uid {st.st_uid})"


def check_can_run(program: str, search_path: str | None, user: WorkloadUser) -> None:
    """StartFailed naming the path when `user` could not run `program` (looked up in
    `search_path` as the workload would). A program that is not found at all is left to fail
    as it does for the agent's own user (exit 127, the reason in its log)."""
    found = program if "/" in program else shutil.which(program, path=search_path)
    if found is None:
        return
    blocked = first_blocked(found, user.uid, user.gid, final=_needs(found))
    if blocked is not None:
        raise StartFailed(
            f"its program {found} cannot be run by the workload's own unprivileged user "
            f"(uid {user.uid}): {describe(blocked)} is closed to other users; install it where "
            "every user may read and run it (not under a private home such as /root)"
        )


def _needs(program: str) -> int:
    """A script (`#!`) must be readable as well as executable; a binary only executable."""
    try:
        with open(program, "rb") as f:
            return R | X if f.read(2) == b"#!" else X
    except OSError:
        return X


def check_can_read(what: str, path: Path, user: WorkloadUser) -> None:
    """StartFailed naming the path when `user` could not read the directory `path`."""
    blocked = first_blocked(path, user.uid, user.gid, final=R | X)
    if blocked is not None:
        raise StartFailed(
            f"{what} {path} cannot be read by the workload's own unprivileged user "
            f"(uid {user.uid}): {describe(blocked)} is closed to other users"
        )


def check_can_read_model(path: Path, user: WorkloadUser) -> None:
    """StartFailed naming the path when `user` could not read the model file (or directory)
    its runtime is to load: better said now than as the runtime's own error a moment later."""
    blocked = first_blocked(path, user.uid, user.gid, final=R | X if path.is_dir() else R)
    if blocked is not None:
        raise StartFailed(
            f"the model {path} cannot be read by the workload's own unprivileged user "
            f"(uid {user.uid}): {describe(blocked)} is closed to other users; put the model "
            "where other users may read it (a downloaded model is kept in the agent's private "
            "data dir, which such a workload cannot read)"
        )


def check_closed(data_dir: Path, user: WorkloadUser) -> None:
    """StartFailed when `user` could enter the agent's data dir: it would read what lies there."""
    if first_blocked(data_dir, user.uid, user.gid, final=X) is None:
        raise StartFailed(
            f"the agent's data dir {describe(data_dir)} is open to other users, so this "
            f"workload's unprivileged user could read it; make it private (chmod 700 {data_dir})"
        )


def kill_all_of(user_uid: int) -> None:
    """SIGKILL every process left running as a workload's own uid (one that left its process
    group and session, say). Only ever a uid of the range: never another user's processes."""
    if not FIRST_UID <= user_uid < FIRST_UID + UID_COUNT:
        raise ValueError(f"uid {user_uid} is not a workload's own")
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and user_uid in (uids.real, uids.effective, uids.saved):
            with contextlib.suppress(psutil.Error):
                proc.kill()


class UidBook:
    """The machine's uids for workloads: which one each workload has, and which are used."""

    def __init__(self, homes: Path = WORKLOAD_HOMES) -> None:
        self.homes = homes
        self._book = homes / "uids.json"

    def claim(self, workdir: Path) -> WorkloadUser:
        """The user of the workload whose agent directory is `workdir`: the uid it has, or a
        new one; its private directory made (0700, its own) and its directory made root-only."""
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(workdir, 0o700)
        key = str(workdir.absolute())
        with self._locked():
            owners, next_uid = self._read()
            uid = uid_of(workdir)
            owner = None if uid is None else owners.get(uid)
            if uid is None or (owner is not None and owner != key and Path(owner).exists()):
                # None yet, or its directory was copied from a workload still there: a new one.
                self._collect(owners)
                uid = self._next_free(owners, next_uid)
                next_uid = uid + 1
            owners[uid] = key
            self._write(owners, next_uid)
            _write_private(workdir / "uid", str(uid))
        user = WorkloadUser(uid, self.homes / str(uid))
        self._make_home(user)
        return user

    def release(self, workdir: Path) -> None:
        """Forget the uid of a workload being deleted, and delete its private directory (the
        uid itself is never handed out again)."""
        uid = uid_of(workdir)
        if uid is None:
            return
        home = self.homes / str(uid)
        if home.is_dir() and not home.is_symlink():
            shutil.rmtree(home)  # fd-based where the OS allows: links inside are not followed
        if not self.homes.is_dir():
            return
        with self._locked():
            owners, next_uid = self._read()
            if owners.get(uid) == str(workdir.absolute()):
                del owners[uid]
                self._write(owners, next_uid)

    def _make_home(self, user: WorkloadUser) -> None:
        user.home.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(user.home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, user.uid, user.gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        blocked = first_blocked(user.home, user.uid, user.gid, final=R | W | X)
        if blocked is not None:
            raise StartFailed(
                f"the workload's private directory {user.home} cannot be reached by its own "
                f"user (uid {user.uid}): {describe(blocked)} is closed to other users"
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.homes.mkdir(mode=0o711, parents=True, exist_ok=True)
        st = os.lstat(self.homes)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise StartFailed(
                f"{describe(self.homes)} must be a directory owned by root that only root may "
                "write to: it holds the private directories of workloads"
            )
        # Others may pass (each to its own directory), not list: 0711 on purpose.
        os.chmod(self.homes, 0o711)  # noqa: S103
        fd = os.open(self.homes / "uids.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # other agents on this machine share the book
            yield
        finally:
            os.close(fd)

    def _read(self) -> tuple[dict[int, str], int]:
        try:
            data = json.loads(self._book.read_text())
            owners = {int(uid): str(key) for uid, key in data["owners"].items()}
            return owners, int(data["next"])
        except FileNotFoundError:
            return {}, FIRST_UID
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StartFailed(
                f"the machine's book of workload uids {self._book} cannot be read ({exc}); "
                "move it aside to start a new one"
            ) from exc

    def _write(self, owners: dict[int, str], next_uid: int) -> None:
        data = {"next": next_uid, "owners": {str(u): k for u, k in sorted(owners.items())}}
        _write_private(self._book, json.dumps(data, indent=1))

    def _collect(self, owners: dict[int, str]) -> None:
        """Forget workloads whose agent directory is gone while the directory above it is
        there (deleted, not on a disk that is not mounted): their private directories too."""
        for uid, key in list(owners.items()):
            workdir = Path(key)
            if not workdir.exists() and workdir.parent.is_dir():
                shutil.rmtree(self.homes / str(uid), ignore_errors=True)
                del owners[uid]

    def _next_free(self, owners: dict[int, str], next_uid: int) -> int:
        """The next uid nobody has: not in the book, no private directory, no process, no
        account (the book may have been lost; a real user may have been made in the range)."""
        live: set[int] = set()
        for proc in psutil.process_iter(["uids"]):
            uids = proc.info.get("uids")
            if uids is not None:
                live.update((uids.real, uids.effective))
        uid = max(next_uid, FIRST_UID)
        while uid < FIRST_UID + UID_COUNT:
            if (
                uid not in owners
                and uid not in live
                and not (self.homes / str(uid)).exists()
                and not _has_account(uid)
            ):
                return uid
            uid += 1
        raise StartFailed(
            f"every uid from {FIRST_UID} to {FIRST_UID + UID_COUNT - 1} has been given to a "
            f"workload on this machine; see {self._book}"
        )


def uid_of(workdir: Path) -> int | None:
    """The uid kept for the workload whose agent directory is `workdir`, if any."""
    try:
        uid = int((workdir / "uid").read_text().strip())
    except (OSError, ValueError):
        return None
    return uid if FIRST_UID <= uid < FIRST_UID + UID_COUNT else None


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, readable by the agent's user only."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
