"""Every process workload sees exactly the GPUs it was booked, and under a root agent can open
only their device nodes (issue 33): on a machine read from an NVML snapshot (three H200s as one
was recorded, the third in MIG mode with three slices), with stand-in device nodes of the same
numbers. A node the workload's cgroup lets through answers ENXIO (no driver behind it); one it
refuses answers EPERM, whatever the workload's environment says.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from einsora.agent.drivers import ProcessDriver
from einsora.agent.workload_python import WorkloadPython
from einsora.common.schemas import (
    Confinement,
    DesiredWorkload,
    Gpu,
    ObservedPhase,
    Resources,
    Target,
    WorkloadKind,
)
from einsora.testing.agent import (
    DEVICE_REPORT,
    DEVICE_REPORTER,
    ControlPlane,
    Processes,
    StartAgent,
    device_nodes,
    device_verdicts,
    open_directory,
)

FIXTURES = Path(__file__).parents[3] / "tests" / "fixtures" / "nvml"
MACHINE = "m-gpu"
running = ObservedPhase.running


@pytest.fixture
def nodes_dir() -> Iterator[Path]:
    with open_directory("einsora-dev-") as path:
        yield path


def reporter(
    control: ControlPlane, workload_id: str, gpus: list[str], python: str, nodes: Path | None
) -> DesiredWorkload:
    workload = control.workload(
        workload_id,
        kind=WorkloadKind.endpoint,
        spec={
            "command": [python, "-c", DEVICE_REPORTER],
            "readiness": "tcp",
            "env": {"NODES": "" if nodes is None else str(nodes)},
        },
    )
    return workload.model_copy(update={"resources": Resources(gpus=gpus)})


async def seen_by(driver: ProcessDriver, data_dir: Path, workload_id: str) -> dict[str, object]:
    report = driver.private_dir(data_dir / "workloads" / workload_id) / "home" / DEVICE_REPORT
    found: dict[str, object] = json.loads(report.read_text())
    return found


async def test_each_workload_sees_and_opens_only_its_own_gpu_or_slice_and_keeps_them_adopted(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
    data_dir: Path,
    nodes_dir: Path,
) -> None:
    settings = {"gpu_inventory": FIXTURES / "h200x3-mig.json"}
    agent = await start_agent(machine_id=MACHINE, python=workload_python.path, settings=settings)
    driver = agent.driver
    assert isinstance(driver, ProcessDriver)
    inventory = await control.inventory(MACHINE)
    assert inventory is not None
    gpus = inventory.gpus
    # The inventory: two whole GPUs, one in MIG mode, and its three slices with their profiles.
    assert [(g.mig, g.mig_mode, g.mig_profile) for g in gpus] == [
        (False, False, None),
        (False, False, None),
        (False, True, None),
        (True, False, "3g.71gb"),
        (True, False, "1g.18gb"),
        (True, False, "1g.18gb"),
    ]
    assert {g.parent_uuid for g in gpus if g.mig} == {gpus[2].uuid}
    assert inventory.device_confinement is not None
    confined = inventory.device_confinement.method
    if os.geteuid() == 0:
        assert confined in (Confinement.cgroup2, Confinement.cgroup1), inventory.device_confinement
        names = device_nodes(nodes_dir, gpus)
    else:
        assert confined is None
        assert "root" in inventory.device_confinement.note
        names = {}
    nodes = nodes_dir if names else None

    booked = {
        "w-whole-0": [gpus[0].uuid],
        "w-whole-1": [gpus[1].uuid],
        "w-slice": [gpus[4].uuid],
        "w-cpu": [],
    }
    python = driver.options.python
    workloads = [reporter(control, w, b, python, nodes) for w, b in booked.items()]
    await control.put_desired(MACHINE, 1, workloads)
    for workload_id, uuids in booked.items():
        seen = await control.wait_workload(MACHINE, workload_id, lambda w: w.phase is running)
        processes.track(seen.pid)
        assert seen.devices is not None
        assert seen.devices.gpus == uuids
        assert seen.devices.confinement is confined
        report = await seen_by(driver, data_dir, workload_id)
        assert report["env"] == {
            "CUDA_VISIBLE_DEVICES": ",".join(uuids),
            "NVIDIA_VISIBLE_DEVICES": ",".join(uuids) or "void",
        }
        if names:
            # Unsetting the variable would not help it: the nodes themselves are refused.
            assert report["nodes"] == device_verdicts(gpus, uuids, names), workload_id

    # A restarted agent adopts them: same processes, same devices, still confined.
    observed = await control.observed(MACHINE)
    assert observed is not None
    before = {w.workload_id: w for w in observed.workloads}
    await agent.stop()
    again = await start_agent(machine_id=MACHINE, python=workload_python.path, settings=settings)
    assert isinstance(again.driver, ProcessDriver)
    await control.put_desired(MACHINE, 2, workloads)
    state = await control.wait_observed(
        MACHINE,
        lambda s: s.generation_applied == 2 and all(w.phase is running for w in s.workloads),
    )
    for seen in state.workloads:
        assert seen.pid == before[seen.workload_id].pid
        assert seen.devices is not None
        assert (seen.devices.gpus, seen.devices.confinement) == (
            booked[seen.workload_id],
            confined,
        )

    # Parked, its cgroup goes; resumed, it sees the same GPU again, confined afresh.
    slice_desired = next(w for w in workloads if w.workload_id == "w-slice")
    parked = [w for w in workloads if w is not slice_desired]
    parked.append(slice_desired.model_copy(update={"target": Target.parked}))
    await control.put_desired(MACHINE, 3, parked)
    await control.wait_workload(MACHINE, "w-slice", lambda w: w.phase is ObservedPhase.parked)
    if names:
        assert driver.confiner.parent is not None
        assert not (driver.confiner.parent / "w-slice").exists()
    await control.put_desired(MACHINE, 4, workloads)
    seen = await control.wait_workload(
        MACHINE, "w-slice", lambda w: w.phase is running and w.pid != before["w-slice"].pid
    )
    processes.track(seen.pid)
    assert seen.devices is not None
    assert seen.devices.gpus == booked["w-slice"]
    if names:
        report = await seen_by(again.driver, data_dir, "w-slice")
        assert report["nodes"] == device_verdicts(gpus, booked["w-slice"], names)


async def test_a_booking_the_machine_cannot_honour_fails_with_the_reason(
    control: ControlPlane,
    start_agent: StartAgent,
    workload_python: WorkloadPython,
) -> None:
    await start_agent(
        machine_id=MACHINE,
        python=workload_python.path,
        settings={"gpu_inventory": FIXTURES / "h200x3-mig.json"},
    )
    inventory = await control.inventory(MACHINE)
    assert inventory is not None
    in_mig_mode = next(g for g in inventory.gpus if g.mig_mode)
    python = workload_python.path
    whole = reporter(control, "w-whole", [in_mig_mode.uuid], python, None)
    gone = reporter(control, "w-gone", ["GPU-00000000-0000-0000-0000-000000000000"], python, None)
    told = reporter(control, "w-told", [], python, None)
    told = told.model_copy(
        update={"spec": {**told.spec, "env": {"CUDA_VISIBLE_DEVICES": in_mig_mode.uuid}}}
    )
    await control.put_desired(MACHINE, 1, [whole, gone, told])
    failed = ObservedPhase.failed
    seen = await control.wait_workload(MACHINE, "w-whole", lambda w: w.phase is failed)
    assert "MIG mode" in seen.reason
    assert "slices" in seen.reason
    seen = await control.wait_workload(MACHINE, "w-gone", lambda w: w.phase is failed)
    assert "not on this machine" in seen.reason
    seen = await control.wait_workload(MACHINE, "w-told", lambda w: w.phase is failed)
    assert "spec.env may not set CUDA_VISIBLE_DEVICES" in seen.reason


def test_gpus_of_a_recorded_h200_are_what_the_agent_reported_there() -> None:
    # The recording (shared/recorded/h200) is real: the agent saw this on the machine itself.
    from einsora.agent import nvml

    gpus = nvml.gpus_of(nvml.load(FIXTURES / "h200.json"))
    assert gpus == [
        Gpu(
            index=0,
            uuid="GPU-27fe208b-01b5-f5c5-e90f-96c0cb499137",
            model="NVIDIA H200",
            memory_mib=143771,
            pci_address="0000:00:06.0",
            device_numbers=["195:0"],
        )
    ]


CONFINED = r"""
import errno, json, os, sys
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
seen = {}
for name in sorted(os.listdir(sys.argv[2])):
    try:
        os.close(os.open(os.path.join(sys.argv[2], name), os.O_RDONLY))
        seen[name] = "opened"
    except OSError as exc:
        seen[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="device cgroups and mknod need root")
@pytest.mark.parametrize("method", [Confinement.cgroup2, Confinement.cgroup1])
def test_each_cgroup_method_holds_a_process_to_its_own_devices(
    method: Confinement, nodes_dir: Path
) -> None:
    import subprocess
    import sys

    from einsora.agent import nvml
    from einsora.agent.drivers.devices import Confiner, DeviceRules

    confiner = next((c for c in Confiner.working()[0] if c.method is method), None)
    if confiner is None:
        pytest.skip(f"{method.value} does not work on this machine: {Confiner.working()[1]}")
    gpus = nvml.gpus_of(nvml.load(FIXTURES / "h200x3-mig.json"))
    names = device_nodes(nodes_dir, gpus)
    for booked in ([gpus[1].uuid], [gpus[3].uuid], [gpus[0].uuid, gpus[5].uuid], []):
        cgroup = confiner.confine("w-probe", DeviceRules.of(gpus, booked))
        assert cgroup is not None
        try:
            out = subprocess.run(
                [sys.executable, "-c", CONFINED, str(cgroup / "cgroup.procs"), str(nodes_dir)],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            )
        finally:
            Confiner.release(cgroup)
        assert json.loads(out.stdout) == device_verdicts(gpus, booked, names), booked
        assert not cgroup.exists()
