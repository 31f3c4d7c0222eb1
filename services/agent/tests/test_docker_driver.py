"""The docker driver on a real Docker Engine (the engine tier): an endpoint's container, found
again by a restarted agent by its record and, without one, by its label, never started twice;
a notebook or endpoint without the image is refused with a reason a person can act on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from einsora.agent.drivers.container.driver import client as docker_client
from einsora.common.schemas import DesiredWorkload, ObservedPhase, Target, WorkloadKind
from einsora.testing.agent import ControlPlane, StartAgent
from einsora.testing.pytest_engines import DockerEngine

pytestmark = pytest.mark.engines


def _endpoint(
    engine: DockerEngine, target: Target = Target.running, **spec: object
) -> DesiredWorkload:
    rootfs = engine.rootfs
    fields: dict[str, object] = {
        "runtime": "command",
        "image": rootfs.tag,
        "command": [rootfs.python, rootfs.stub, "$PORT"],
        "readiness_path": "/health",
    }
    fields.update(spec)
    return ControlPlane.workload(
        "w-box", target=target, kind=WorkloadKind.endpoint, spec=fields, driver="docker"
    )


def _container_id(engine: DockerEngine, name: str) -> str:
    docker = docker_client(engine.url, 30)
    try:
        return str(docker.containers.get(name).id)
    finally:
        docker.close()


async def test_a_restarted_agent_adopts_its_container_by_record_then_by_label(
    docker_engine: DockerEngine, start_agent: StartAgent, control: ControlPlane, data_dir: Path
) -> None:
    agent = await start_agent(machine_id="m-box", engines=docker_engine.options())
    inventory = await control.inventory("m-box")
    assert inventory is not None
    assert "docker" in inventory.drivers
    assert "docker-kata" not in inventory.drivers  # no Kata runtime in this engine
    await control.put_desired("m-box", 1, [_endpoint(docker_engine)])
    running = await control.wait_workload(
        "m-box", "w-box", lambda w: w.phase is ObservedPhase.running, within_s=60
    )
    first = _container_id(docker_engine, "einsora-w-box")
    record = data_dir / "agent" / "m-box" / "workloads" / "w-box.json"
    for forget_record in (False, True):
        await agent.stop()  # the agent only: its workloads keep running
        if forget_record:
            record.unlink()
        agent = await start_agent(machine_id="m-box", engines=docker_engine.options())
        adopted = await control.wait_workload(
            "m-box",
            "w-box",
            lambda w: w.phase is ObservedPhase.running and w.endpoint is not None,
            within_s=30,
        )
        assert adopted.endpoint is not None
        assert running.endpoint is not None
        assert adopted.endpoint.port == running.endpoint.port
        assert _container_id(docker_engine, "einsora-w-box") == first  # not started again
    await control.put_desired("m-box", 2, [_endpoint(docker_engine, Target.removed)])
    await control.wait_workload(
        "m-box", "w-box", lambda w: w.phase is ObservedPhase.removed, within_s=60
    )


async def test_an_image_the_engine_lacks_fails_saying_so(
    docker_engine: DockerEngine, start_agent: StartAgent, control: ControlPlane
) -> None:
    await start_agent(machine_id="m-box2", engines=docker_engine.options())
    await control.put_desired("m-box2", 1, [_endpoint(docker_engine, image="nowhere:1")])
    failed = await control.wait_workload(
        "m-box2", "w-box", lambda w: w.phase is ObservedPhase.failed, within_s=30
    )
    assert "spec.image nowhere:1 is not on this machine's Docker engine" in failed.reason
