"""`--sim-inventory` specs and files become the inventory a sim machine reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from einsora.agent import sim_inventory
from einsora.common.catalog import Catalog
from einsora.common.errors import ConfigError


def test_spec_string_builds_gpus_from_the_catalog() -> None:
    machine = sim_inventory.load("4x l40s-48gb, 64 cpu, 512 GiB")
    inv = machine.inventory("m-a", "local", ["sim"])
    l40s = Catalog.load().get("l40s-48gb")
    assert l40s is not None
    assert inv.cpus == 64
    assert inv.memory_mib == 512 * 1024
    assert len(inv.gpus) == 4
    assert {g.model for g in inv.gpus} == {"L40S"}
    assert all(g.memory_mib == l40s.memory_mib for g in inv.gpus)
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3]
    assert len({g.uuid for g in inv.gpus}) == 4
    assert all(l40s.matches_gpu(g.model, g.memory_mib) for g in inv.gpus)
    assert inv.drivers == ["sim"]
    assert (inv.os, inv.arch) == ("linux", "x86_64")


def test_fake_uuids_are_stable_per_machine() -> None:
    machine = sim_inventory.load("2x h100-80gb")
    a1 = [g.uuid for g in machine.inventory("m-a", "local", ["sim"]).gpus]
    a2 = [g.uuid for g in machine.inventory("m-a", "local", ["sim"]).gpus]
    b = [g.uuid for g in machine.inventory("m-b", "local", ["sim"]).gpus]
    assert a1 == a2
    assert not set(a1) & set(b)


@pytest.mark.parametrize(
    ("spec", "cpus", "memory_mib", "gpus"),
    [
        ("l4-24gb", 8, 32 * 1024, 1),
        ("2 x a100-80gb; 16 cores; 1 TiB", 16, 1024 * 1024, 2),
        ("4x l40s-48gb, 2x t4-16gb, 32 cpus, 256 GB memory", 32, 256 * 1024, 6),
        ("2x cpu-4c-16g", 8, 32 * 1024, 0),
        ("64 cpu, 512 GiB", 64, 512 * 1024, 0),
    ],
)
def test_spec_variants(spec: str, cpus: int, memory_mib: int, gpus: int) -> None:
    inv = sim_inventory.load(spec).inventory("m-x", "local", ["sim"])
    assert (inv.cpus, inv.memory_mib, len(inv.gpus)) == (cpus, memory_mib, gpus)


def test_apple_silicon_class_reports_chip_and_unified_memory() -> None:
    inv = sim_inventory.load("apple-silicon-32gb, 12 cpu, 32 GiB").inventory(
        "m-mac", "local", ["sim"]
    )
    assert inv.os == "darwin"
    assert inv.arch == "arm64"
    assert inv.unified_memory_mib == 32 * 1024
    assert inv.apple_chip
    cls = Catalog.load().get("apple-silicon-32gb")
    assert cls is not None
    assert cls.matches_gpu(inv.gpus[0].model, inv.gpus[0].memory_mib)


def test_text_and_json_files(tmp_path: Path) -> None:
    text = tmp_path / "machine.txt"
    text.write_text("2x l40s-48gb\n48 cpu\n384 GiB\nhostname=rack1-07\n")
    inv = sim_inventory.load(str(text)).inventory("m-f", "local", ["sim"])
    assert (len(inv.gpus), inv.cpus, inv.memory_mib, inv.hostname) == (
        2,
        48,
        384 * 1024,
        "rack1-07",
    )

    js = tmp_path / "machine.json"
    js.write_text(json.dumps({"gpus": {"h200-141gb": 8}, "cpus": 192, "memory": "2 TiB"}))
    inv = sim_inventory.load(str(js)).inventory("m-j", "local", ["sim"])
    assert (len(inv.gpus), inv.cpus, inv.memory_mib) == (8, 192, 2 * 1024 * 1024)

    listed = tmp_path / "list.json"
    listed.write_text(json.dumps({"gpus": [{"class": "l4-24gb", "count": 3}], "memory_gib": 64}))
    inv = sim_inventory.load(str(listed)).inventory("m-l", "local", ["sim"])
    assert (len(inv.gpus), inv.memory_mib) == (3, 64 * 1024)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("4x b300-288gb", "unknown class 'b300-288gb'"),
        ("4x l40s-48gb, lots of ram", "'lots of ram' is not understood"),
        ("", "empty"),
        ('{"gpus": 4}', "gpus must be an object or a list"),
        ('{"cpus": -1}', "cpus must be a whole number"),
        ("{not json", "JSON is not valid"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        sim_inventory.load(spec)
    assert message in raised.value.message
