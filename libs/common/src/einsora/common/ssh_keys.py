"""The tunnel's SSH keys (ADR-0015): made once, kept 0600 in a 0700 directory, read back.

A machine's agent keeps its tunnel host key this way, and the proxy's tunnel hub keeps its
client key. Both made the key the same way, in two copies, before issue 37. A key is written to
a temporary file and linked into place, so two processes starting at once never replace each
other's key. The second one reads the first one's key.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import asyncssh

from einsora.common.errors import ConfigError


def key_line(key: asyncssh.SSHKey) -> str:
    """A public key as one OpenSSH line, without a comment."""
    return key.export_public_key("openssh").decode().split("\n")[0].strip()


def load_or_make_key(path: Path, *, what: str, public_beside: bool = False) -> asyncssh.SSHKey:
    """The ed25519 key at `path`, made on first use (0600, in a 0700 directory). `what` names
    it in the error a person reads when it cannot be read. With `public_beside`, its public
    line is written to `<path>.pub` too."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        made = asyncssh.generate_private_key("ssh-ed25519")
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(made.export_private_key("openssh"))
        try:
            os.link(tmp, path)  # never replaces a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    try:
        key = asyncssh.read_private_key(path)
    except (OSError, asyncssh.KeyImportError) as exc:
        raise ConfigError(f"cannot read the {what} at {path}: {exc.__class__.__name__}") from exc
    if public_beside:
        path.with_name(path.name + ".pub").write_text(key_line(key) + "\n")
    return key


def quiet_asyncssh() -> None:
    """asyncssh logs every channel and auth step at INFO; ours log what matters. A level an
    operator set is kept."""
    library = logging.getLogger("asyncssh")
    if library.level == logging.NOTSET:
        library.setLevel(logging.WARNING)
