"""Secrets at rest (issue 9, hole 5): the data dir is 0700 and its files 0600, and no
workload's token is in any database file.

Before, `scheduler_workloads` held every notebook's Jupyter token in clear and `einsora.db` was
0644 in a 0755 data dir, so any local user could read them.
"""

from __future__ import annotations

import stat
from pathlib import Path

from tests.conftest import OpenApi, StartPlane

from einsora.cli.controlplane import ControlPlane


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _token(plane: ControlPlane, workload_id: str) -> bytes:
    """The token the scheduler put in the workload's desired state (and would put in its route)."""
    assert plane.scheduler is not None
    return plane.scheduler.engine.book.workloads[workload_id].access_token.encode()


async def test_the_data_dir_is_private_and_no_token_is_stored(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="sim", sim_inventory="1x l40s-48gb, 8 cpu, 32 GiB")
    api = await api_of(plane)
    made = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    await api.wait_state(made["id"], "running")
    token = _token(plane, made["id"])
    assert len(token) >= 40

    data_dir = plane.settings.data_dir
    assert _mode(data_dir) == 0o700
    for path in data_dir.iterdir():
        expected = 0o700 if path.is_dir() else 0o600
        assert _mode(path) & ~expected == 0, (path, oct(_mode(path)))
    databases = [p for p in data_dir.iterdir() if p.name.startswith("einsora.db")]
    assert {p.name for p in databases} >= {"einsora.db", "einsora.db-wal"}
    for path in databases:
        assert token not in path.read_bytes(), path

    # After a restart the workload's token is the same (derived, not stored), so what its
    # agent runs and what the proxy injects still agree.
    await plane.stop()
    await plane.start()
    await api.wait_state(made["id"], "running")
    assert _token(plane, made["id"]) == token
