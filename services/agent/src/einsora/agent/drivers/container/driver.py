"""The `docker` driver: a notebook or an endpoint in a container of Docker Engine.

It talks to the engine through its API with the `docker` package (blocking calls, each in a
thread). A workload's spec names an `image` the engine already has (Einsora pulls nothing: an
image is the machine owner's to load); its container and its volume are made from
`config.create_kwargs`. Running is its readiness probe answering through the published port
(Docker's proxy accepts a connection before anything listens in the container, so the probe is
an HTTP GET, not a connect). **Park** stops and removes the container and keeps its volume;
**resume** makes a new container on the same volume; **remove** deletes the volume too.

The same class serves `docker-kata` (`runtime="kata"`): the engine's Kata runtime runs each
container in its own VM. Which of the two is strong isolation is the catalog's to say.

A restarted agent finds its containers by record or by label (`discover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from einsora.agent.drivers.base import Adoption, Handle, Observation, StartFailed
from einsora.agent.drivers.container import config
from einsora.agent.drivers.launch import write_secret
from einsora.agent.drivers.probe import PROBE_TIMEOUT_S, Probe, failure
from einsora.common.schemas import (
    Confinement,
    ContainerSpec,
    DesiredWorkload,
    DeviceAccess,
    Endpoint,
    EndpointRuntime,
    ObservedPhase,
    WorkloadKind,
    utcnow,
)
from einsora.common.schemas.base import what_is_wrong

log = logging.getLogger("einsora.agent")

LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class DockerOptions:
    """How the docker driver reaches its engine."""

    base_url: str | None = None
    """The engine's address (`unix:///var/run/docker.sock`); None: `DOCKER_HOST` or Docker's
    default."""
    machine_id: str = ""
    poll_s: float = 1.0
    starting_poll_s: float = 0.25
    probe_timeout_s: float = PROBE_TIMEOUT_S
    timeout_s: float = 60.0
    """The longest one API call may take."""


@dataclass
class ContainerHandle(Handle):
    """A running container: its name and readiness probe."""

    container: str = ""
    workdir: str = ""
    probe: Probe | None = None


DEFAULT_SOCKET = "unix:///var/run/docker.sock"
API_VERSION = "1.41"
"""Docker Engine 20.10's API, which later engines still serve: named, so making a client does
not call the engine (an engine that does not answer would leave its socket open)."""


def docker_url(configured: str | None) -> str:
    """The engine's address: as configured, else `DOCKER_HOST`, else Docker's default socket."""
    return configured or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def unix_socket_refusal(url: str, timeout_s: float) -> str | None:
    """Why a `unix://` engine socket cannot be reached (None: it accepts, or not unix). The
    docker package leaves a socket open when its connect fails, so this is tried first."""
    if not url.startswith("unix://"):
        return None
    path = url.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(path)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
    return None


def client(base_url: str | None, timeout_s: float = 60.0) -> Any:
    """A Docker API client (blocking; it connects at its first call)."""
    import docker

    if base_url is None:
        return docker.from_env(timeout=int(timeout_s), version=API_VERSION)
    return docker.DockerClient(base_url=base_url, timeout=int(timeout_s), version=API_VERSION)


def read_spec(spec: dict[str, Any]) -> ContainerSpec:
    try:
        return ContainerSpec.model_validate(spec)
    except ValidationError as exc:
        raise StartFailed(f"the container's spec is not valid: {what_is_wrong(exc)}") from exc


class DockerDriver:
    """Runs notebooks and endpoints in containers (`runtime`: an OCI runtime such as Kata)."""

    def __init__(
        self,
        options: DockerOptions | None = None,
        *,
        name: str = "docker",
        runtime: str | None = None,
    ) -> None:
        self.options = options or DockerOptions()
        self.name = name
        self.runtime = runtime
        self._client: Any = None

    def _docker(self) -> Any:
        import docker.errors

        if self._client is None:
            url = docker_url(self.options.base_url)
            refused = unix_socket_refusal(url, 5.0)
            if refused is not None:
                raise StartFailed(f"Docker Engine does not answer: {refused}")
            try:
                self._client = client(url, self.options.timeout_s)
            except docker.errors.DockerException as exc:
                raise StartFailed(f"Docker Engine does not answer: {exc}") from None
        return self._client

    # --- start --------------------------------------------------------------------------

    async def start(self, workload: DesiredWorkload, workdir: Path | None) -> Handle:
        if workdir is None:
            raise StartFailed("the docker driver needs a working directory")
        if workload.kind is WorkloadKind.vm:
            raise StartFailed("the docker driver cannot run a vm; the libvirt driver does")
        spec = read_spec(workload.spec)
        token_file = None
        if workload.kind is WorkloadKind.notebook:
            if not workload.access_token:
                raise StartFailed("a notebook needs its access token from the control plane")
            port = spec.port or config.NOTEBOOK_PORT
            command: list[str] | None = spec.command or config.notebook_command(
                port, spec.volume_path
            )
            token_file = str(workdir / "token")
            readiness = Probe(
                kind="http", port=0, path="/api/status", expect_status=200, token_file=token_file
            )
        else:
            runtime = workload.spec.get("runtime", EndpointRuntime.command.value)
            if runtime != EndpointRuntime.command.value:
                raise StartFailed(
                    f"the docker driver runs endpoints of the command runtime (spec.command in "
                    f"spec.image), not {runtime}"
                )
            port = spec.port or config.ENDPOINT_PORT
            command = spec.command
            readiness = Probe(kind="http", port=0, path=spec.readiness_path or "/")
        plan = config.ContainerPlan(
            workload_id=workload.workload_id,
            machine_id=self.options.machine_id,
            driver=self.name,
            image=spec.image,
            port=port,
            command=command,
            env=dict(spec.env),
            volume_path=spec.volume_path,
            token_file=token_file,
            gpus=list(workload.resources.gpus),
            cpus=workload.resources.cpus,
            memory_mib=workload.resources.memory_mib,
            runtime=self.runtime,
        )
        try:
            await asyncio.to_thread(workdir.mkdir, mode=0o700, parents=True, exist_ok=True)
            if token_file is not None and workload.access_token:
                await asyncio.to_thread(_write_token, Path(token_file), workload.access_token)
        except OSError as exc:
            raise StartFailed(f"could not prepare the container: {exc}") from exc
        host_port = await asyncio.to_thread(self._run, plan)
        probe = Probe(
            kind=readiness.kind,
            port=host_port,
            path=readiness.path,
            expect_status=readiness.expect_status,
            token_file=readiness.token_file,
        )
        runtime_name = None if workload.kind is WorkloadKind.notebook else "command"
        return ContainerHandle(
            workload_id=workload.workload_id,
            started_at=utcnow(),
            endpoint=Endpoint(host="127.0.0.1", port=host_port, runtime=runtime_name),
            container=config.container_name(workload.workload_id),
            workdir=str(workdir),
            probe=probe,
            devices=DeviceAccess(gpus=plan.gpus, confinement=Confinement.container),
        )

    def _run(self, plan: config.ContainerPlan) -> int:
        """Create the volume and the container, start it; its published host port."""
        import docker.errors

        docker_client = self._docker()
        name = config.container_name(plan.workload_id)
        with contextlib.suppress(docker.errors.NotFound):
            old = docker_client.containers.get(name)
            old.remove(force=True)  # a stopped one left over: a fresh container, same volume
        try:
            try:
                docker_client.volumes.get(config.volume_name(plan.workload_id))
            except docker.errors.NotFound:
                docker_client.volumes.create(
                    config.volume_name(plan.workload_id),
                    labels={
                        config.LABEL_WORKLOAD: plan.workload_id,
                        config.LABEL_MACHINE: plan.machine_id,
                    },
                )
            container = docker_client.containers.create(**config.create_kwargs(plan))
            container.start()
            container.reload()
        except docker.errors.ImageNotFound:
            raise StartFailed(
                f"spec.image {plan.image} is not on this machine's Docker engine (Einsora "
                "pulls no image: its owner loads it, e.g. docker load or docker import)"
            ) from None
        except docker.errors.DockerException as exc:
            raise StartFailed(f"Docker could not start the container: {_explain(exc)}") from None
        published = (container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{plan.port}/tcp")
        if not published:
            raise StartFailed(f"Docker published no host port for the container's {plan.port}")
        return int(published[0]["HostPort"])

    # --- observe, park, stop, remove ----------------------------------------------------

    async def observe(self, handle: Handle) -> Observation:
        assert isinstance(handle, ContainerHandle)
        try:
            status, why = await asyncio.to_thread(self._status, handle.container)
        except StartFailed as exc:
            return Observation(
                ObservedPhase.starting, exc.message, recheck_s=self.options.starting_poll_s
            )
        if status != "running":
            return Observation(ObservedPhase.failed, why)
        reason = (
            None
            if handle.probe is None
            else await failure(handle.probe, self.options.probe_timeout_s)
        )
        if reason is None:
            return Observation(ObservedPhase.running, recheck_s=self.options.poll_s)
        return Observation(ObservedPhase.starting, reason, recheck_s=self.options.starting_poll_s)

    def _status(self, name: str) -> tuple[str, str]:
        import docker.errors

        try:
            container = self._docker().containers.get(name)
        except docker.errors.NotFound:
            return "gone", f"its container {name} is gone (removed outside Einsora)"
        except docker.errors.DockerException as exc:
            raise StartFailed(f"Docker does not answer: {_explain(exc)}") from None
        state = container.attrs.get("State", {})
        status = str(state.get("Status", "unknown"))
        if status == "running":
            return status, ""
        code = state.get("ExitCode")
        tail = _tail(container)
        return status, f"its container {status} (exit code {code})" + (
            f"; last lines of its log: {tail}" if tail else ""
        )

    async def park(self, handle: Handle, grace_s: float) -> str:
        await self.stop(handle, grace_s)
        return (
            f"with its container stopped and removed; its volume "
            f"{config.volume_name(handle.workload_id)} is kept"
        )

    async def stop(self, handle: Handle, grace_s: float) -> None:
        assert isinstance(handle, ContainerHandle)
        await asyncio.to_thread(self._stop, handle.container, grace_s)

    def _stop(self, name: str, grace_s: float) -> None:
        import docker.errors

        try:
            container = self._docker().containers.get(name)
        except docker.errors.NotFound:
            return
        with contextlib.suppress(docker.errors.NotFound):
            container.stop(timeout=max(1, round(grace_s)))
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)

    async def delete(self, workdir: Path) -> None:
        await asyncio.to_thread(self._delete, workdir.name)
        await asyncio.to_thread(shutil.rmtree, workdir)

    def _delete(self, workload_id: str) -> None:
        import docker.errors

        try:
            docker_client = self._docker()
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.containers.get(config.container_name(workload_id)).remove(force=True)
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.volumes.get(config.volume_name(workload_id)).remove(force=True)
        except (docker.errors.DockerException, StartFailed) as exc:
            raise OSError(f"its container or volume could not be deleted: {exc}") from None

    # --- records and adoption -----------------------------------------------------------

    def record(self, handle: Handle) -> dict[str, Any] | None:
        assert isinstance(handle, ContainerHandle)
        return {
            "workload_id": handle.workload_id,
            "container": handle.container,
            "started_at": handle.started_at.isoformat(),
            "workdir": handle.workdir,
            "endpoint": None if handle.endpoint is None else handle.endpoint.model_dump(),
            "probe": None if handle.probe is None else handle.probe.to_dict(),
            "ready": handle.ready,
        }

    async def adopt(self, record: dict[str, Any]) -> Adoption:
        try:
            handle = ContainerHandle(
                workload_id=str(record["workload_id"]),
                started_at=datetime.fromisoformat(str(record["started_at"])),
                container=str(record["container"]),
                workdir=str(record.get("workdir", "")),
                endpoint=None
                if record.get("endpoint") is None
                else Endpoint.model_validate(record["endpoint"]),
                probe=None if record.get("probe") is None else Probe.from_dict(record["probe"]),
                ready=record.get("ready") is True,
            )
        except (KeyError, TypeError, ValueError) as exc:
            return Adoption(None, f"its record could not be read ({exc})")
        try:
            status, why = await asyncio.to_thread(self._status, handle.container)
        except StartFailed as exc:
            return Adoption(None, exc.message)
        if status != "running":
            return Adoption(None, f"{why}, while the agent was not running")
        return Adoption(handle)

    async def discover(self, machine_id: str) -> dict[str, dict[str, Any]]:
        try:
            return await asyncio.to_thread(self._discover, machine_id)
        except StartFailed as exc:  # no engine here (the inventory says why): no containers
            log.debug("no containers to find", extra={"error": exc.message})
            return {}
        except Exception as exc:  # an engine that answers badly: nothing found, said once
            log.warning("running containers could not be listed", extra={"error": repr(exc)})
            return {}

    def _discover(self, machine_id: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        containers = self._docker().containers.list(
            filters={"label": [f"{config.LABEL_MACHINE}={machine_id}"]}
        )
        for container in containers:
            labels = container.labels or {}
            workload_id = labels.get(config.LABEL_WORKLOAD)
            if not workload_id or labels.get(config.LABEL_DRIVER) != self.name:
                continue
            ports = container.attrs["NetworkSettings"]["Ports"] or {}
            published = next((v for v in ports.values() if v), None)
            if not published:
                continue
            port = int(published[0]["HostPort"])
            found[workload_id] = {
                "workload_id": workload_id,
                "container": container.name,
                "started_at": utcnow().isoformat(),
                "endpoint": Endpoint(host="127.0.0.1", port=port).model_dump(),
                "probe": Probe(kind="http", port=port).to_dict(),
                "ready": True,
            }
        return found


def _write_token(path: Path, token: str) -> None:
    """The workload's token for its container: readable by anyone inside it (its user may be
    any uid), in the agent's 0700 directory that nobody else on the host can enter."""
    write_secret(path, token)
    path.chmod(0o644)


def _tail(container: Any) -> str:
    try:
        raw = container.logs(tail=LOG_TAIL_LINES)
    except Exception:  # the log driver may not keep logs: no tail is no loss
        return ""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return " | ".join(line for line in text.strip().splitlines()[-5:])[:500]


def _explain(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)[:300]
