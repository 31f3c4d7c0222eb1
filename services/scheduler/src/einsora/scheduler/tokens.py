"""Workloads' own tokens (a notebook's Jupyter token), derived where they are needed.

The scheduler writes each workload's token into its machine's desired state (for the agent)
and its route (for the proxy). It keeps no token in its tables (issue 9, hole 5): a token is
HMAC-SHA256 of the workload id under a key that lives only in a 0600 file of the data dir, so
the same workload always gets the same token (a resumed notebook keeps it, a bucket rebuilt
from the store carries it again) and a copy of the database reveals none.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from einsora.common.errors import ConfigError

KEY_FILE = "workload-tokens.key"
_KEY_BYTES = 32


class WorkloadTokens:
    """Derives each workload's token from one secret key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < _KEY_BYTES:
            raise ValueError("a workload token key has at least 32 bytes")
        self._key = key

    @classmethod
    def ephemeral(cls) -> WorkloadTokens:
        """A key for this process only (tests and benchmarks that keep no data dir)."""
        return cls(secrets.token_bytes(_KEY_BYTES))

    @classmethod
    def from_file(cls, path: Path) -> WorkloadTokens:
        """The key in `path`, made (mode 0600) on first use."""
        try:
            if not path.exists():
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                partial = path.with_name(f".{path.name}.partial")
                with contextlib.suppress(FileNotFoundError):
                    partial.unlink()
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(_KEY_BYTES) + "\n")
                os.replace(partial, path)
            key = bytes.fromhex(path.read_text().strip())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read or make the workload token key {path}: {exc}") from exc
        return cls(key)

    def for_workload(self, workload_id: str) -> str:
        digest = hmac.new(self._key, f"workload-token:{workload_id}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")
