"""Every workload gets exactly the GPUs it was given, end to end (issue 33): a real control
plane (api, scheduler, accounting, and this machine's agent with the `process` driver) on a
machine whose GPUs are read from an NVML snapshot: three H200s as one was recorded, the third in
MIG mode with a 3g.71gb and two 1g.18gb slices; or two H200 NVL, a model the catalog never heard
of. The workloads are real processes that report what they see: their environment, and whether
they can open each GPU's device node (stand-ins with the real numbers: a node the workload's
cgroup lets through answers ENXIO, one it refuses EPERM).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import Api, OpenApi, StartPlane

from einsora.agent.drivers import ProcessDriver
from einsora.cli.controlplane import ControlPlane
from einsora.common.schemas import Gpu
from einsora.testing.agent import (
    DEVICE_REPORT,
    DEVICE_REPORTER,
    device_nodes,
    device_verdicts,
    open_directory,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
MIG_MACHINE = FIXTURES / "h200x3-mig.json"
pytestmark = pytest.mark.slow


@pytest.fixture
def nodes_dir() -> Iterator[Path | None]:
    """Stand-in device nodes need mknod (root); without root there are none to open."""
    if os.geteuid() != 0:
        yield None
        return
    with open_directory("einsora-dev-") as path:
        yield path


def driver_of(plane: ControlPlane) -> ProcessDriver:
    assert plane.agent is not None
    driver = plane.agent.driver
    assert isinstance(driver, ProcessDriver)
    return driver


def gpus_of(plane: ControlPlane) -> list[Gpu]:
    assert plane.agent is not None
    return list(plane.agent.machines[plane.agent.machine_id].inventory.gpus)


async def launch(
    api: Api,
    plane: ControlPlane,
    class_name: str,
    nodes: Path | None,
    fallback: list[dict[str, str]] | None = None,
) -> str:
    """A reporter endpoint of `class_name`; its id."""
    spec = {
        "runtime": "command",
        "command": [driver_of(plane).options.python, "-c", DEVICE_REPORTER],
        "readiness": "tcp",
        "env": {"NODES": "" if nodes is None else str(nodes)},
    }
    body: dict[str, Any] = {"kind": "endpoint", "class": class_name, "spec": spec}
    if fallback:
        body["fallback"] = fallback
    made = await api.ok("POST", "/v1/workloads", body)
    return str(made["id"])


async def seen_by(plane: ControlPlane, workload_id: str) -> dict[str, Any]:
    """What the workload reported seeing (written once it started, before it served)."""
    workdir = plane.settings.data_dir / "workloads" / workload_id
    report = driver_of(plane).private_dir(workdir) / "home" / DEVICE_REPORT
    for _ in range(200):
        if report.exists():
            found: dict[str, Any] = json.loads(report.read_text())
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workload_id} wrote no {DEVICE_REPORT}")


async def placement_note(api: Api, workload_id: str) -> str:
    events = await api.ok("GET", f"/v1/workloads/{workload_id}/events")
    notes = [e["reason"] for e in events["items"] if e["state"] == "scheduled"]
    assert notes, events
    return str(notes[-1])


def given(note: str) -> list[str]:
    """The uuids a placement note says were given, in order (a slice's, not its GPU's)."""
    part = note.split("; given ", 1)[1].split(";")[0]
    found = []
    for item in part.split(", "):
        uuid = re.search(r"slice (MIG-[0-9a-f-]+)", item) or re.match(r"(GPU-[0-9a-f-]+)", item)
        assert uuid is not None, note
        found.append(uuid[1])
    return found


async def classes_of(api: Api) -> dict[str, dict[str, Any]]:
    page = await api.ok("GET", "/v1/classes?limit=200")
    return {c["name"]: c for c in page["items"]}


async def test_whole_gpus_and_mig_slices_each_seen_by_one_workload_and_a_cpu_one_sees_none(
    start_plane: StartPlane, api_of: OpenApi, nodes_dir: Path | None
) -> None:
    plane = await start_plane(driver="process", settings={"gpu_inventory": MIG_MACHINE})
    api = await api_of(plane)
    gpus = gpus_of(plane)
    names = {} if nodes_dir is None else device_nodes(nodes_dir, gpus)

    # Offered: the H200 class (two of the three GPUs: the third is in MIG mode) and a class
    # for each MIG profile, derived from the slices with no configuration.
    classes = await classes_of(api)
    assert classes["h200-141gb"]["regions"] == ["local"]
    assert classes["h200-141gb"]["free"] == 2
    assert (classes["h200-1g.18gb"]["mig_profile"], classes["h200-1g.18gb"]["automatic"]) == (
        "1g.18gb",
        True,
    )
    assert classes["h200-1g.18gb"]["free"] == 2
    assert classes["h200-3g.71gb"]["regions"] == ["local"]

    launched = {
        "whole": [await launch(api, plane, "h200-141gb", nodes_dir) for _ in range(2)],
        "slice": [await launch(api, plane, "h200-1g.18gb", nodes_dir) for _ in range(2)],
        "cpu": [await launch(api, plane, "cpu-1c-2g", nodes_dir)],
    }
    # A third of each queues, with its reason: no GPU and no slice is ever given twice.
    third_whole = await launch(api, plane, "h200-141gb", nodes_dir)
    third_slice = await launch(api, plane, "h200-1g.18gb", nodes_dir)
    seen_uuids: list[str] = []
    for kind, ids in launched.items():
        for workload_id in ids:
            await api.wait_state(workload_id, "running")
            note = await placement_note(api, workload_id)
            report = await seen_by(plane, workload_id)
            booked = given(note) if kind != "cpu" else []
            assert len(booked) == (0 if kind == "cpu" else 1), note
            if kind == "slice":
                assert "MIG 1g.18gb slice MIG-" in note, note
            assert report["env"] == {
                "CUDA_VISIBLE_DEVICES": ",".join(booked),
                "NVIDIA_VISIBLE_DEVICES": ",".join(booked) or "void",
            }, workload_id
            if names:
                assert report["nodes"] == device_verdicts(gpus, booked, names), workload_id
            seen_uuids += booked
    assert len(seen_uuids) == len(set(seen_uuids)) == 4
    in_mig_mode = next(g.uuid for g in gpus if g.mig_mode)
    assert in_mig_mode not in seen_uuids  # never given out whole
    for workload_id, class_name in ((third_whole, "h200-141gb"), (third_slice, "h200-1g.18gb")):
        await api.wait_state(workload_id, "queued")
        events = await api.ok("GET", f"/v1/workloads/{workload_id}/events")
        reason = events["items"][-1]["reason"]
        assert f"has 1 {class_name} free" in reason, reason

    # Parked, a slice goes to the one waiting for it; resumed, the parked one waits its turn.
    parked_id = launched["slice"][0]
    parked_slice = given(await placement_note(api, parked_id))
    await api.ok("POST", f"/v1/workloads/{parked_id}/park")
    await api.wait_state(parked_id, "parked")
    await api.wait_state(third_slice, "running")
    assert given(await placement_note(api, third_slice)) == parked_slice
    report = await seen_by(plane, third_slice)
    assert report["env"]["CUDA_VISIBLE_DEVICES"] == parked_slice[0]

    # A slice workload that opted in falls back to the bigger slice when both small ones are
    # taken, and is metered as what it was placed as.
    chained = await launch(
        api, plane, "h200-1g.18gb", nodes_dir, fallback=[{"class": "h200-3g.71gb"}]
    )
    placed = await api.wait_state(chained, "running")
    assert placed["placement"]["placed_class"] == "h200-3g.71gb"
    note = await placement_note(api, chained)
    assert "MIG 3g.71gb slice MIG-" in note, note
    assert (await seen_by(plane, chained))["env"]["CUDA_VISIBLE_DEVICES"] == given(note)[0]

    # Resumed, the parked one waits for a slice; given one, it sees that one only.
    await api.ok("POST", f"/v1/workloads/{parked_id}/resume")
    await api.wait_state(parked_id, "queued")
    await api.ok("DELETE", f"/v1/workloads/{third_slice}")
    await api.wait_state(parked_id, "running")
    resumed_note = await placement_note(api, parked_id)
    assert given(resumed_note) == parked_slice, resumed_note
    assert (await seen_by(plane, parked_id))["env"]["CUDA_VISIBLE_DEVICES"] == parked_slice[0]

    # Metering and the export name the slice's class.
    async def metered() -> dict[str, Any] | None:
        report = await api.ok("GET", "/v1/usage?group_by=class")
        rows = [r for r in report["items"] if r["group"] == "h200-1g.18gb" and r["gpu_hours"]]
        return rows[0] if rows else None

    for _ in range(100):
        if await metered() is not None:
            break
        await asyncio.sleep(0.1)
    assert await metered() is not None, "the slices were never metered"
    export = await api.ok("GET", f"/v1/workloads/{launched['slice'][1]}/export")
    history = export["placement_history"]
    assert history[-1]["placed_class"] == "h200-1g.18gb"
    assert "MIG 1g.18gb slice MIG-" in history[-1]["reason"]


async def test_a_gpu_model_the_catalog_never_heard_of_is_offered_and_placed(
    start_plane: StartPlane, api_of: OpenApi, nodes_dir: Path | None
) -> None:
    plane = await start_plane(
        driver="process", settings={"gpu_inventory": FIXTURES / "h200-nvl.json"}
    )
    api = await api_of(plane)
    classes = await classes_of(api)
    automatic = classes["h200-nvl-140gb"]
    assert automatic["automatic"] is True
    assert automatic["regions"] == ["local"]
    assert "automatic" in automatic["description"]
    workload_id = await launch(api, plane, "h200-nvl-140gb", nodes_dir)
    await api.wait_state(workload_id, "running")
    booked = given(await placement_note(api, workload_id))
    assert booked == [gpus_of(plane)[0].uuid]
    assert (await seen_by(plane, workload_id))["env"]["CUDA_VISIBLE_DEVICES"] == booked[0]


async def test_the_catalog_setting_renames_and_hides_classes_for_the_scheduler_too(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    catalog = tmp_path / "catalog.json"
    catalog.write_text(
        json.dumps(
            {
                "classes": [
                    {
                        "name": "h200-nvl",
                        "accelerator": "nvidia",
                        "model": "H200 NVL",
                        "memory_gib": 141,
                        "description": "the lab's H200 NVL",
                    }
                ],
                "hide": ["cpu-8c-32g"],
            }
        )
    )
    plane = await start_plane(
        driver="process",
        settings={"gpu_inventory": FIXTURES / "h200-nvl.json", "catalog": catalog},
    )
    api = await api_of(plane)
    classes = await classes_of(api)
    assert classes["h200-nvl"]["regions"] == ["local"]
    assert "h200-nvl-140gb" not in classes  # renamed: the operator's class serves the devices
    assert "cpu-8c-32g" not in classes
    # The scheduler read the same file: it places the renamed class (a class it did not know
    # would fail the workload as "not in the catalog").
    workload_id = await launch(api, plane, "h200-nvl", None)
    running = await api.wait_state(workload_id, "running")
    assert running["placement"]["placed_class"] == "h200-nvl"
    for hidden in ("cpu-8c-32g", "h200-nvl-140gb"):
        status, body = await api.call(
            "POST", "/v1/workloads", {"kind": "notebook", "class": hidden}
        )
        assert status == 422, body
        assert hidden in json.dumps(body)
