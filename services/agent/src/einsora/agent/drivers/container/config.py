"""What the docker driver asks Docker Engine for: a container's create arguments, from a plain
plan, so each is a golden test without an engine.

A workload's container is `einsora-<workload>`, labelled with the workload, its machine and the
driver, so a restarted agent finds it by label. Its one port is published on 127.0.0.1 only (a
random free host port Docker picks); its volume `einsora-<workload>` (kept while it is parked,
deleted with it) is mounted at `volume_path`. A notebook runs Jupyter on its port with the
workload's token in a read-only file mounted from the agent's directory (never in its
environment, which `docker inspect` shows); an endpoint runs its `command` with `$PORT`. GPUs are
`DeviceRequests` for NVIDIA's container toolkit, by uuid: the workload sees its own GPUs only.
With the Kata runtime the container runs in its own VM (`docker-kata`: strong isolation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from docker.types import DeviceRequest

from einsora.agent.drivers import devices

LABEL_WORKLOAD = "einsora.workload"
LABEL_MACHINE = "einsora.machine"
LABEL_DRIVER = "einsora.driver"
TOKEN_IN_CONTAINER = "/run/einsora/token"  # noqa: S105 - a path, not a secret
NOTEBOOK_PORT = 8888
ENDPOINT_PORT = 8000


def container_name(workload_id: str) -> str:
    return f"einsora-{workload_id}"


def volume_name(workload_id: str) -> str:
    return f"einsora-{workload_id}"


def device_requests(gpus: list[str]) -> list[DeviceRequest]:
    """NVIDIA's container toolkit gives the container exactly these GPUs (by uuid)."""
    if not gpus:
        return []
    return [DeviceRequest(driver="nvidia", device_ids=list(gpus), capabilities=[["gpu"]])]


@dataclass(frozen=True)
class ContainerPlan:
    """Everything one workload's container is made of."""

    workload_id: str
    machine_id: str
    driver: str
    image: str
    port: int
    command: list[str] | None
    env: dict[str, str] = field(default_factory=dict)
    volume_path: str = "/data"
    token_file: str | None = None
    """The agent's copy of the workload's token, mounted read-only at `TOKEN_IN_CONTAINER`."""
    gpus: list[str] = field(default_factory=list)
    cpus: float = 0.0
    memory_mib: int = 0
    runtime: str | None = None
    """The OCI runtime (`kata` for docker-kata); None: the engine's default."""


def notebook_command(port: int, root: str) -> list[str]:
    """Jupyter in the container: every address inside it (the port is published on the host's
    127.0.0.1 only), its token from the mounted file."""
    return [
        "jupyter",
        "server",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=0.0.0.0",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
    ]


def with_port(command: list[str], port: int) -> list[str]:
    return [a.replace("${PORT}", str(port)).replace("$PORT", str(port)) for a in command]


def create_kwargs(plan: ContainerPlan) -> dict[str, Any]:
    """The arguments of `containers.create` for `plan`. Its GPUs are its DeviceRequests, and
    its environment says them last, whatever its spec or image says: a container booked none
    gets `NVIDIA_VISIBLE_DEVICES=void`, so an engine whose default runtime is NVIDIA's gives it
    none (a CUDA image says `all`)."""
    env = {**plan.env, **devices.visible_env(plan.gpus), "PORT": str(plan.port)}
    volumes: dict[str, dict[str, str]] = {
        volume_name(plan.workload_id): {"bind": plan.volume_path, "mode": "rw"}
    }
    if plan.token_file is not None:
        env["JUPYTER_TOKEN_FILE"] = TOKEN_IN_CONTAINER
        volumes[plan.token_file] = {"bind": TOKEN_IN_CONTAINER, "mode": "ro"}
    kwargs: dict[str, Any] = {
        "image": plan.image,
        "name": container_name(plan.workload_id),
        "labels": {
            LABEL_WORKLOAD: plan.workload_id,
            LABEL_MACHINE: plan.machine_id,
            LABEL_DRIVER: plan.driver,
        },
        "environment": dict(sorted(env.items())),
        "ports": {f"{plan.port}/tcp": ("127.0.0.1", None)},
        "volumes": volumes,
        "working_dir": plan.volume_path,
        "security_opt": ["no-new-privileges"],
        "restart_policy": {"Name": "no"},
        "detach": True,
    }
    if plan.command is not None:
        kwargs["command"] = with_port(plan.command, plan.port)
    requests = device_requests(plan.gpus)
    if requests:
        kwargs["device_requests"] = requests
    if plan.cpus > 0:
        kwargs["nano_cpus"] = int(plan.cpus * 1e9)
    if plan.memory_mib > 0:
        kwargs["mem_limit"] = f"{plan.memory_mib}m"
    if plan.runtime is not None:
        kwargs["runtime"] = plan.runtime
    return kwargs
