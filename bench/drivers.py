"""How long each driver takes: launch to running for a process notebook, a container and a VM
under TCG; for the VM, park and resume by managed save and by shutdown. Median of 5 each.

Measured at the driver (start, then its readiness check until it answers; park; start again),
as the agent's supervisor drives it, without the bus (a few milliseconds, bench/admission.py).
The engines are the engine tier's: libvirtd and dockerd started by hand as root when they do
not answer (and stopped after), the tiny guest and the stub image from the engines cache
(`einsora.testing.guest`). A part that cannot run here is skipped with its reason, and
its figures are null.

The process notebook is Jupyter started as the agent's own user (the bench does not make
workload users, ADR-0007); the container is the stub endpoint (busybox and Python: a Jupyter
image would be a download); the VM boots a Debian kernel and a busybox initramfs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _harness import report

from einsora.agent.drivers import Driver, Handle, ProcessDriver, ProcessOptions
from einsora.agent.drivers.container import DockerDriver, DockerOptions
from einsora.agent.drivers.vm import LibvirtDriver, VmOptions
from einsora.common.schemas import DesiredWorkload, ObservedPhase, Resources, Target, WorkloadKind
from einsora.testing import engines as testing_engines
from einsora.testing import guest as testing_guest

RUNS = 5
POLL_S = 0.05
LIMIT_S = 300.0


def _workload(workload_id: str, kind: WorkloadKind, spec: dict[str, Any]) -> DesiredWorkload:
    return DesiredWorkload(
        workload_id=workload_id,
        tenant_id="t-bench",
        kind=kind,
        class_name="cpu-1c-2g",
        target=Target.running,
        spec=spec,
        resources=Resources(cpus=1, memory_mib=2048),
        access_token="bench-token-" + workload_id,
    )


async def until_running(driver: Driver, handle: Handle) -> None:
    deadline = time.monotonic() + LIMIT_S
    while True:
        seen = await driver.observe(handle)
        if seen.phase is ObservedPhase.running:
            return
        if seen.phase is ObservedPhase.failed:
            raise RuntimeError(f"failed: {seen.reason}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not running after {LIMIT_S:g} s: {seen.reason}")
        await asyncio.sleep(POLL_S)


async def timed(work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    began = time.perf_counter()
    result = await work()
    return time.perf_counter() - began, result


async def launches(
    driver: Driver, make: Callable[[int], DesiredWorkload], root: Path
) -> list[float]:
    """Launch to running, `RUNS` times, each workload removed after."""
    samples = []
    for i in range(RUNS):
        workload = make(i)
        workdir = root / workload.workload_id

        async def launch(w: DesiredWorkload = workload, d: Path = workdir) -> Handle:
            handle = await driver.start(w, d)
            await until_running(driver, handle)
            return handle

        took, handle = await timed(launch)
        samples.append(took)
        await driver.stop(handle, 5)
        await driver.delete(workdir)
    return samples


async def vm_park_resume(
    driver: LibvirtDriver, workload: DesiredWorkload, workdir: Path
) -> tuple[list[float], list[float]]:
    """Park and resume one VM `RUNS` times: (park seconds, resume-to-running seconds)."""
    handle = await driver.start(workload, workdir)
    await until_running(driver, handle)
    parks: list[float] = []
    resumes: list[float] = []
    for _ in range(RUNS):
        began = time.perf_counter()
        await driver.park(handle, 60)
        parks.append(time.perf_counter() - began)

        async def resume() -> Handle:
            resumed = await driver.start(workload, workdir)
            await until_running(driver, resumed)
            return resumed

        took, handle = await timed(resume)
        resumes.append(took)
    await driver.stop(handle, 5)
    await driver.delete(workdir)
    return parks, resumes


def median(samples: list[float] | None) -> float | None:
    return None if not samples else round(statistics.median(samples), 3)


async def process_notebook(root: Path) -> list[float]:
    driver = ProcessDriver(ProcessOptions(unprivileged=False, poll_s=POLL_S))
    return await launches(driver, lambda i: _workload(f"w-nb{i}", WorkloadKind.notebook, {}), root)


async def container(root: Path) -> list[float]:
    why = testing_engines.why_no_docker()
    if why is not None:
        raise SkipPart(why)
    cache = testing_guest.cache_dir()
    rootfs = testing_guest.build_container_rootfs(cache)
    url, daemon = testing_engines.start_dockerd(cache)
    try:
        testing_engines.import_image(url, rootfs)
        driver = DockerDriver(DockerOptions(base_url=url, machine_id="m-bench", poll_s=POLL_S))
        spec = {
            "runtime": "command",
            "image": rootfs.tag,
            "command": [rootfs.python, rootfs.stub, "$PORT"],
            "readiness_path": "/health",
        }
        return await launches(
            driver, lambda i: _workload(f"w-ct{i}", WorkloadKind.endpoint, spec), root
        )
    finally:
        testing_engines.remove_einsora_containers(url)
        if daemon is not None:
            daemon.stop()


async def vm(root: Path) -> dict[str, list[float]]:
    why = testing_engines.why_no_libvirt()
    if why is not None:
        raise SkipPart(why)
    guest = testing_guest.build_guest()
    started = testing_engines.start_libvirtd()
    vm_dir = Path(tempfile.mkdtemp(prefix="einsora-bench-vms-"))
    os.chmod(vm_dir, 0o711)  # noqa: S103 - qemu's own user must reach the disks in it
    try:
        driver = LibvirtDriver(
            VmOptions(
                vm_dir=vm_dir,
                image_dirs=(guest.disk.parent,),
                machine_id="m-bench",
                workdirs=root,
                poll_s=POLL_S,
                starting_poll_s=POLL_S,
            )
        )

        def spec(park: str) -> dict[str, Any]:
            return {
                "image": str(guest.disk),
                "image_format": "qcow2",
                "memory_mib": 256,
                "vcpus": 1,
                "boot": {
                    "kernel": str(guest.kernel),
                    "initrd": str(guest.initrd),
                    "cmdline": guest.cmdline,
                },
                "http_port": guest.http_port,
                "park": park,
            }

        boots = await launches(
            driver, lambda i: _workload(f"w-vm{i}", WorkloadKind.vm, spec("save")), root
        )
        save_parks, save_resumes = await vm_park_resume(
            driver, _workload("w-vmsave", WorkloadKind.vm, spec("save")), root / "w-vmsave"
        )
        off_parks, off_resumes = await vm_park_resume(
            driver, _workload("w-vmoff", WorkloadKind.vm, spec("shutdown")), root / "w-vmoff"
        )
        return {
            "boot": boots,
            "save_park": save_parks,
            "save_resume": save_resumes,
            "shutdown_park": off_parks,
            "shutdown_resume": off_resumes,
        }
    finally:
        testing_engines.remove_einsora_domains(vm_dir)
        shutil.rmtree(vm_dir, ignore_errors=True)
        for daemon in reversed(started):
            daemon.stop()


class SkipPart(Exception):
    """A part of the bench this machine cannot run; the message says why."""


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="einsora-bench-drivers-"))
    skipped: dict[str, str] = {}
    results: dict[str, Any] = {}
    try:
        for name, part in (("process", process_notebook), ("container", container), ("vm", vm)):
            try:
                results[name] = await part(root)
            except SkipPart as exc:
                skipped[name] = str(exc)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    vm_runs: dict[str, list[float]] = results.get("vm") or {}
    figures: dict[str, Any] = {
        "runs": RUNS,
        "process_notebook_launch_to_running_s": median(results.get("process")),
        "container_endpoint_launch_to_running_s": median(results.get("container")),
        "vm_tcg_launch_to_running_s": median(vm_runs.get("boot")),
        "vm_park_managed_save_s": median(vm_runs.get("save_park")),
        "vm_resume_from_managed_save_to_running_s": median(vm_runs.get("save_resume")),
        "vm_park_shutdown_s": median(vm_runs.get("shutdown_park")),
        "vm_resume_from_shutdown_to_running_s": median(vm_runs.get("shutdown_resume")),
    }

    def shown(key: str) -> str:
        value = figures[key]
        return "skipped" if value is None else f"{value:.2f} s"

    rows = [
        (
            "process notebook (Jupyter): launch → running",
            shown("process_notebook_launch_to_running_s"),
        ),
        (
            "container (stub endpoint): launch → running",
            shown("container_endpoint_launch_to_running_s"),
        ),
        ("VM under TCG: launch → running", shown("vm_tcg_launch_to_running_s")),
        ("VM park, managed save", shown("vm_park_managed_save_s")),
        (
            "VM resume from managed save → running",
            shown("vm_resume_from_managed_save_to_running_s"),
        ),
        ("VM park, ACPI shutdown", shown("vm_park_shutdown_s")),
        (
            "VM resume after shutdown → running (boot)",
            shown("vm_resume_from_shutdown_to_running_s"),
        ),
    ]
    rows += [(f"skipped {name}", why) for name, why in skipped.items()]
    rows.append(("each", f"median of {RUNS}"))
    report("drivers", rows, figures)


if __name__ == "__main__":
    asyncio.run(main())
