"""What the agent remembers of the processes it started, so a restarted agent adopts them.

One small JSON file per workload under `<data_dir>/agent/<machine>/workloads/`, outside the
workload's own directory (a workload must not be able to point the agent at another process),
written atomically, readable only by the agent's user.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("einsora.agent")


class RecordStore:
    """Records of one machine's workloads, by workload id."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, workload_id: str) -> Path:
        return self.root / f"{workload_id}.json"

    def save(self, workload_id: str, record: dict[str, Any]) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.root / f".{workload_id}.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(workload_id))

    def delete(self, workload_id: str) -> None:
        self._path(workload_id).unlink(missing_ok=True)

    def load_all(self) -> dict[str, dict[str, Any]]:
        """Every record that can be read; an unreadable one is logged and set aside."""
        records: dict[str, dict[str, Any]] = {}
        if not self.root.is_dir():
            return records
        for path in sorted(self.root.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                log.warning(
                    "workload record unreadable; set aside",
                    extra={"path": str(path), "error": str(exc)},
                )
                path.replace(path.with_suffix(".unreadable"))
                continue
            records[path.stem] = data
        return records
