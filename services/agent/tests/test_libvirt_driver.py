"""The libvirt driver on a real libvirtd, with the tiny guest under TCG (the engine tier).

The test plays the scheduler (desired states on a real NATS); the agent is the real one. A VM
runs (its HTTP port answers), parks with a managed save (a file in its memory-backed /tmp is
still there after resume: it did not boot again), parks by shutdown (the file on its disk is
there after a cold boot), and is removed with its disk. A SIGKILLed agent's VM keeps running
and the next agent adopts it, by its record and, without one, by its domain.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import aiohttp
import asyncssh
import pytest

from einsora.agent.drivers.vm import domain_name
from einsora.common.schemas import (
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    Target,
    WorkloadKind,
)
from einsora.common.testing import Bus, subprocess_env
from einsora.testing.agent import ControlPlane, StartAgent
from einsora.testing.pytest_engines import LibvirtEngine

pytestmark = pytest.mark.engines

BOOT_S = 180.0
"""A TCG boot takes seconds alone, longer on a loaded 2-core machine."""
TOKEN = "vm-token-for-tests"
VIRSH = shutil.which("virsh") or "/usr/bin/virsh"


@pytest.fixture(scope="module")
def key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


def _public(key: asyncssh.SSHKey) -> str:
    return key.export_public_key("openssh").decode().strip()


async def _connect(key: asyncssh.SSHKey, port: int) -> asyncssh.SSHClientConnection:
    """An SSH connection to the guest as root: its HTTP port (its readiness) may answer a
    moment before its SSH server does, so a refused or reset connection is tried again."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            return await asyncssh.connect(
                "127.0.0.1",
                port,
                username="root",
                client_keys=[key],
                known_hosts=None,
                config=[],
                agent_path=None,
            )
        except (OSError, asyncssh.ConnectionLost):
            if asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.2)


async def ssh(key: asyncssh.SSHKey, port: int, command: str) -> str:
    """Run `command` on the guest as root through its forwarded SSH port."""
    conn = await _connect(key, port)
    async with conn:
        done = await conn.run(command)
    assert done.exit_status == 0, (command, done.exit_status, done.stdout, done.stderr)
    return str(done.stdout)


async def http_text(port: int) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as r:
        assert r.status == 200
        return await r.text()


def _running(w: ObservedWorkload) -> bool:
    return w.phase is ObservedPhase.running


def _vm(
    engine: LibvirtEngine,
    key: asyncssh.SSHKey,
    target: Target,
    workload_id: str = "w-vm",
    **spec: object,
) -> object:
    return ControlPlane.workload(
        workload_id,
        target=target,
        kind=WorkloadKind.vm,
        spec=engine.vm_spec(ssh_key=_public(key), **spec),
        access_token=TOKEN,
        driver="libvirt",
    )


def _domain_exists(name: str) -> bool:
    done = subprocess.run(
        [VIRSH, "-c", "qemu:///system", "domstate", name], capture_output=True, check=False
    )
    return done.returncode == 0


async def test_a_vm_runs_parks_with_a_managed_save_or_a_shutdown_resumes_and_is_removed(
    libvirt_engine: LibvirtEngine,
    start_agent: StartAgent,
    control: ControlPlane,
    key: asyncssh.SSHKey,
) -> None:
    agent = await start_agent(machine_id="m-vm", engines=libvirt_engine.options())
    inventory = await control.inventory("m-vm")
    assert inventory is not None
    assert "libvirt" in inventory.drivers
    report = next(e for e in inventory.engines if e.name == "libvirt")
    assert report.available
    assert report.virtualization is not None

    await control.put_desired("m-vm", 1, [_vm(libvirt_engine, key, Target.running)])  # type: ignore[list-item]
    running = await control.wait_workload("m-vm", "w-vm", _running, within_s=BOOT_S)
    assert running.endpoint is not None
    ports = running.endpoint.ports
    assert set(ports) == {"http", "ssh", "console"}
    assert set(ports.values()) <= agent.workload_ports()  # what its tunnel may forward
    assert "served from its data disk" in await http_text(ports["http"])
    await ssh(key, ports["ssh"], "echo on-disk > /data/marker && echo in-memory > /tmp/m && sync")

    # Park with a managed save: resume continues where it stopped (its /tmp survived).
    await control.put_desired("m-vm", 2, [_vm(libvirt_engine, key, Target.parked)])  # type: ignore[list-item]
    parked = await control.wait_workload(
        "m-vm", "w-vm", lambda w: w.phase is ObservedPhase.parked, within_s=60
    )
    assert parked.reason.startswith("with a managed save in "), parked.reason
    assert _domain_exists(domain_name("w-vm"))
    resume = _vm(libvirt_engine, key, Target.running, park="shutdown")
    await control.put_desired("m-vm", 3, [resume])  # type: ignore[list-item]
    running = await control.wait_workload("m-vm", "w-vm", _running, within_s=BOOT_S)
    assert running.endpoint is not None
    ports = running.endpoint.ports
    assert await ssh(key, ports["ssh"], "cat /data/marker /tmp/m") == "on-disk\nin-memory\n"

    # Park by shutdown: the disk is kept, memory is not (a resume boots it again).
    await control.put_desired("m-vm", 4, [_vm(libvirt_engine, key, Target.parked)])  # type: ignore[list-item]
    parked = await control.wait_workload(
        "m-vm", "w-vm", lambda w: w.phase is ObservedPhase.parked, within_s=60
    )
    assert parked.reason.startswith("shut down (ACPI) in "), parked.reason
    await control.put_desired("m-vm", 5, [_vm(libvirt_engine, key, Target.running)])  # type: ignore[list-item]
    running = await control.wait_workload("m-vm", "w-vm", _running, within_s=BOOT_S)
    assert running.endpoint is not None
    ports = running.endpoint.ports
    assert await ssh(key, ports["ssh"], "cat /data/marker; ls /tmp") == "on-disk\n"

    # Remove: the domain, its managed save and its disk go.
    await control.put_desired("m-vm", 6, [_vm(libvirt_engine, key, Target.removed)])  # type: ignore[list-item]
    await control.wait_workload(
        "m-vm", "w-vm", lambda w: w.phase is ObservedPhase.removed, within_s=60
    )
    assert not _domain_exists(domain_name("w-vm"))
    assert not (libvirt_engine.vm_dir / "w-vm").exists()


class AgentProcess:
    """`einsora agent` as a subprocess, SIGKILLed by the test."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=subprocess_env(EINSORA_LOG_FORMAT="text"),
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def agent_process(
    bus: Bus, data_dir: Path, libvirt_engine: LibvirtEngine, tmp_path: Path
) -> Iterator[AgentProcess]:
    einsora = str(Path(sys.executable).parent / "einsora")
    argv = [
        einsora,
        "agent",
        "--nats",
        bus.url,
        "--machine-id",
        "m-kill",
        "--data-dir",
        str(data_dir),
        "--heartbeat",
        "0.5",
        "--grace",
        "5",
        "--no-docker",
        "--vm-dir",
        str(libvirt_engine.vm_dir),
        "--vm-images",
        str(libvirt_engine.guest.disk.parent),
    ]
    agent = AgentProcess(argv, tmp_path / "agent.log")
    yield agent
    agent.kill()


async def test_a_killed_agents_vm_keeps_running_and_is_adopted_by_record_then_by_domain(
    libvirt_engine: LibvirtEngine,
    control: ControlPlane,
    key: asyncssh.SSHKey,
    agent_process: AgentProcess,
    data_dir: Path,
) -> None:
    agent_process.start()
    vm = _vm(libvirt_engine, key, Target.running, "w-kill")
    await control.put_desired("m-kill", 1, [vm])  # type: ignore[list-item]
    running = await control.wait_workload("m-kill", "w-kill", _running, within_s=BOOT_S)
    assert running.endpoint is not None
    ssh_port = running.endpoint.ports["ssh"]
    await ssh(key, ssh_port, "echo still-up > /tmp/alive")

    record = data_dir / "agent" / "m-kill" / "workloads" / "w-kill.json"
    for forget_record in (False, True):
        agent_process.kill()
        assert _domain_exists(domain_name("w-kill"))
        if forget_record:
            record.unlink()  # the engine alone says what runs: the domain and its metadata
        before = await control.observed("m-kill")
        assert before is not None
        seen = before.heartbeat_at

        def reported_running(s: ObservedState, seen: datetime = seen) -> bool:
            fresh = s.heartbeat_at > seen
            return fresh and any(w.workload_id == "w-kill" and _running(w) for w in s.workloads)

        agent_process.start()
        await control.wait_observed("m-kill", reported_running, within_s=60)
        # The same guest, not booted again: its memory-backed file is still there.
        assert await ssh(key, ssh_port, "cat /tmp/alive") == "still-up\n"
        assert record.exists()
    log = agent_process.log.read_text()
    assert "workload adopted" in log
    assert "workload found by its engine, without a record" in log

    await control.put_desired("m-kill", 2, [_vm(libvirt_engine, key, Target.removed, "w-kill")])  # type: ignore[list-item]
    await control.wait_workload(
        "m-kill", "w-kill", lambda w: w.phase is ObservedPhase.removed, within_s=60
    )
    assert not _domain_exists(domain_name("w-kill"))
    await asyncio.sleep(0)


async def test_libvirt_takes_the_golden_passthrough_domain_as_valid(
    libvirt_engine: LibvirtEngine,
) -> None:
    """The golden domain XML (two GPUs passed through, KVM) is one libvirt defines with its
    schema validation on; it is not started (no GPU here)."""
    import libvirt

    golden = (Path(__file__).parent / "golden" / "domain_passthrough.xml").read_text()
    xml = golden.replace("einsora-w-gpu", "einsora-w-golden-check")
    conn = libvirt.open(libvirt_engine.uri)
    try:
        dom = conn.defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
        try:
            assert dom.name() == "einsora-w-golden-check"
            defined = dom.XMLDesc(0)
            assert defined.count("<hostdev mode='subsystem' type='pci' managed='yes'>") == 2
            assert "hostfwd=tcp:127.0.0.1:40022-:22" in defined
        finally:
            dom.undefine()
    finally:
        conn.close()
