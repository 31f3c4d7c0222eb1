"""The plain parts of a VM's plan: its spec read, its host ports picked and checked, its
readiness probe and endpoint, and the plan kept in the agent's directory of the workload (so a
parked VM resumes with the same ports and devices, and a restarted agent can read it).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from einsora.agent.drivers.base import StartFailed
from einsora.agent.drivers.launch import free_port, write_secret
from einsora.agent.drivers.probe import Probe
from einsora.agent.drivers.vm.domain import DomainPlan, Forward
from einsora.common.schemas import Endpoint, VmSpec
from einsora.common.schemas.base import what_is_wrong


def read_spec(spec: dict[str, Any]) -> VmSpec:
    try:
        return VmSpec.model_validate(spec)
    except ValidationError as exc:
        raise StartFailed(f"the vm's spec is not valid: {what_is_wrong(exc)}") from exc


def port_free(port: int) -> bool:
    """Whether qemu (which binds its forwards with SO_REUSEADDR, as this does) could listen on
    127.0.0.1:`port` now; a connection of the VM's that lingers in TIME_WAIT does not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def load_spec(path: Path) -> VmSpec | None:
    try:
        return VmSpec.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return None


def probe_of(spec: VmSpec, ports: dict[str, int]) -> Probe | None:
    kind = spec.readiness_kind
    if kind == "http" and "http" in ports:
        return Probe(kind="http", port=ports["http"], path=spec.readiness_path)
    if kind == "ssh" and "ssh" in ports:
        return Probe(kind="ssh", port=ports["ssh"])
    return None


def endpoint_of(ports: dict[str, int]) -> Endpoint:
    """Where the VM answers: its web UI when it has one, else its console relay."""
    main = ports.get("http", ports.get("console", 0))
    return Endpoint(host="127.0.0.1", port=main, ports=dict(ports))


def pick_ports(spec: VmSpec) -> tuple[tuple[Forward, ...], dict[str, int]]:
    forwards = [Forward("ssh", free_port(), spec.ssh_port)]
    if spec.http_port is not None:
        forwards.append(Forward("http", free_port(), spec.http_port))
    ports = {f.name: f.host_port for f in forwards}
    ports["console"] = free_port()
    return tuple(forwards), ports


def with_ports(plan: DomainPlan, picked: tuple[tuple[Forward, ...], dict[str, int]]) -> DomainPlan:
    forwards, ports = picked
    return DomainPlan(**{**asdict(plan), "forwards": forwards, "ports": ports})


def save_plan(path: Path, plan: DomainPlan) -> None:
    data = asdict(plan)
    write_secret(path, json.dumps(data))


def load_plan(path: Path) -> DomainPlan:
    data = json.loads(path.read_text())
    data["forwards"] = tuple(Forward(**f) for f in data.get("forwards", []))
    data["hostdevs"] = tuple(data.get("hostdevs", []))
    return DomainPlan(**data)


def with_uuid(xml: str, uuid: str) -> str:
    return xml.replace("<name>", f"<uuid>{uuid}</uuid>\n  <name>", 1)


def drop_managed_save(dom: Any) -> None:
    if dom.hasManagedSaveImage(0):
        dom.managedSaveRemove(0)


def make_vm_dir(root: Path, vm_dir: Path) -> None:
    """`<vm_dir>/<workload>`, reachable (not listable) by qemu's user."""
    for path in (root, vm_dir):
        path.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(path, 0o711)  # noqa: S103 - enter, not list: qemu's user reaches its own files
