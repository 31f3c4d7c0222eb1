"""Machine ids (given, or made once and kept) and this host's own inventory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from einsora.agent import identity, inventory
from einsora.agent.service import AgentService
from einsora.common.errors import ConfigError
from einsora.common.ids import is_id
from einsora.common.settings import Settings


def test_machine_id_is_made_once_and_kept(tmp_path: Path) -> None:
    first = identity.resolve_machine_id(tmp_path, None)
    assert is_id(first, "machine")
    assert (tmp_path / "machine-id").read_text().strip() == first
    assert identity.resolve_machine_id(tmp_path, None) == first
    assert identity.resolve_machine_id(tmp_path, "m-given") == "m-given"


@pytest.mark.parametrize("bad", ["m.1", "m 1", "m>", "a*", ""])
def test_machine_ids_that_would_break_a_subject_are_refused(tmp_path: Path, bad: str) -> None:
    if not bad:
        (tmp_path / "machine-id").write_text("\n")
    with pytest.raises(ConfigError):
        identity.resolve_machine_id(tmp_path, bad or None)


def test_sim_machine_ids_derive_from_the_base() -> None:
    assert identity.sim_machine_ids("m-x", 1) == ["m-x"]
    assert identity.sim_machine_ids("m-x", 3) == ["m-x-0001", "m-x-0002", "m-x-0003"]
    assert identity.sim_machine_ids("m-x", 12000)[-1] == "m-x-12000"
    with pytest.raises(ConfigError):
        identity.sim_machine_ids("m-x", 0)


def test_host_inventory_reports_this_machine() -> None:
    inv = inventory.collect("m-here", "local", ["process"])
    assert inv.machine_id == "m-here"
    assert inv.cpus >= 1
    assert inv.memory_mib > 0
    assert inv.os in ("linux", "darwin")
    assert inv.arch
    assert inv.hostname
    assert inv.drivers == ["process"]
    assert inv.agent_version == "0.1.0"
    # Without NVML (no NVIDIA driver here) there are no NVIDIA GPUs, and no error either.
    assert all(g.uuid for g in inv.gpus)
    assert inventory.same(inv, inventory.collect("m-here", "local", ["process"]))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"driver": "docker"}, "unknown driver 'docker'"),
        ({"driver": "process", "sim_machines": 3}, "need the sim driver"),
        ({"driver": "process", "sim_inventory": "1x l4-24gb"}, "need the sim driver"),
        ({"driver": "sim", "heartbeat_s": 0}, "heartbeat interval must be more than 0 s"),
        ({"driver": "sim", "sim_inventory": "9x warp-drive"}, "unknown class 'warp-drive'"),
        ({"driver": "sim", "machine_id": "m.1"}, "machine id 'm.1' is not valid"),
        # Solo keeps every identity's seed as <identity>.nk in one dir: no machine may share one.
        ({"driver": "sim", "machine_id": "system"}, "control plane's own bus identities"),
        ({"driver": "sim", "machine_id": "scheduler"}, "control plane's own bus identities"),
    ],
)
def test_agent_options_are_checked_before_start(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        AgentService(Settings(data_dir=tmp_path), **options)
    assert message in raised.value.message
