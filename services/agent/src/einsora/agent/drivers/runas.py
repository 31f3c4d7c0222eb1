"""The first moments of a workload that runs as a user of its own (ADR-0007).

A root agent cannot start a process as another user with `posix_spawn`, so it spawns this file with
its own Python (`python -I -S runas.py <launch file>`, an empty environment: nothing the workload's
spec says reaches a process that is still root). As root it reads the launch file (in the agent's
root-only directory of the workload) and deletes it, reads the workload's token, and joins the
workload's device cgroup (`devices`) where it has one; then it becomes the workload's user for good
(no groups, real, effective and saved ids), and only then touches the workload's private directory:
it makes its directories and writes its token file (0600) there, enters its current directory and
`exec`s the workload's program, so the pid the agent knows is the workload's.

Standard library only, and nothing here runs in the agent's own process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from typing import Any, NoReturn


def fail(code: int, message: str) -> NoReturn:
    print(f"einsora: {message}", file=sys.stderr, flush=True)
    os._exit(code)


def become(uid: int, gid: int) -> None:
    """Drop root for good; fails the start rather than run the workload as root."""
    try:
        os.setgroups([])
        if hasattr(os, "setresuid"):
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        else:  # macOS: as root, these set the real, effective and saved ids alike
            os.setgid(gid)
            os.setuid(uid)
    except OSError as exc:
        fail(125, f"could not become uid {uid}: {exc}")
    ids = (os.getuid(), os.geteuid(), os.getgid(), os.getegid())
    if ids != (uid, uid, gid, gid) or os.getgroups():
        fail(125, f"could not become uid {uid} for good")
    try:
        os.setuid(0)
    except PermissionError:
        return
    fail(125, "could take root back after dropping it; not starting the workload")


def write_token(path: str, token: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode())
    finally:
        os.close(fd)


def main(launch_file: str) -> NoReturn:
    with open(launch_file, encoding="utf-8") as f:
        launch: dict[str, Any] = json.load(f)
    os.unlink(launch_file)  # it holds the workload's environment: gone once read
    token = None
    if launch.get("token_from"):
        with open(launch["token_from"], encoding="utf-8") as f:
            token = f.read()
    if launch.get("cgroup"):
        # Still root: the workload and all it starts are in its device cgroup from here on.
        try:
            with open(launch["cgroup"], "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            fail(125, f"could not enter its device cgroup {launch['cgroup']}: {exc}")
    become(int(launch["uid"]), int(launch["gid"]))
    os.umask(0o077)
    try:
        for path in launch["dirs"]:
            os.makedirs(path, mode=0o700, exist_ok=True)
        if token is not None:
            write_token(launch["token_to"], token)
        os.chdir(launch["cwd"])
    except OSError as exc:
        fail(126, f"could not prepare the workload's private directory: {exc}")
    # Python ignores these; the workload gets the defaults a shell would give it.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    argv: list[str] = launch["argv"]
    env: dict[str, str] = launch["env"]
    # Looked up as the shell would, as the workload's user: a PATH entry it may not enter
    # (root's own, say) is skipped, not an error.
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if program is None:
        fail(127, f"{argv[0]}: not found")
    try:
        os.execve(program, argv, env)  # noqa: S606 (exec, as the shell would)
    except FileNotFoundError:
        fail(127, f"{argv[0]}: not found")
    except OSError as exc:
        fail(126, f"{argv[0]}: {exc.strerror or exc}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail(2, "usage: runas.py LAUNCH_FILE")
    main(sys.argv[1])
