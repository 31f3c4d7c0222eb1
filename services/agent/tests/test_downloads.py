"""Downloads are bounded (issue 34): a model's or a VM image's `https://` URI reaches only public
addresses unless the machine's owner allows a network, a download stops at its cap, the
workload's reason says how far it got, and what is (or is not) listening at an address the
agent may not reach makes no difference to the reason a user reads.

Every origin is a real HTTPS server on 127.0.0.1; the agent is the real one, in-process with
the default settings, or as `einsora agent` with its owner's settings in its environment (and
the test's certificate as its trusted one)."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from pathlib import Path

import gguf
import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web

from einsora.agent.downloads import DownloadPolicy
from einsora.common.schemas import DesiredWorkload, ObservedPhase, Resources, Target, WorkloadKind
from einsora.common.testing import Bus, self_signed_certificate, subprocess_env
from einsora.testing.agent import ControlPlane, StartAgent

PROGRESS = re.compile(r"downloading model: [0-9.]+ of [0-9.]+ (bytes|KiB|MiB|GiB)")


def make_gguf(path: Path) -> bytes:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def endpoint(workload_id: str, model: str) -> DesiredWorkload:
    """An endpoint whose runtime (vLLM, given no GPU) is refused once its model is checked:
    nothing runs after the download."""
    return DesiredWorkload(
        workload_id=workload_id,
        tenant_id="t-test",
        kind=WorkloadKind.endpoint,
        class_name="cpu-1c-2g",
        target=Target.running,
        spec={"runtime": "vllm", "model": model},
        resources=Resources(),
    )


@dataclass
class Origin:
    """An HTTPS server of model files on 127.0.0.1."""

    port: int
    cert: Path
    fetched: dict[str, int]
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by the test: the slow file's second half is sent."""

    def url(self, path: str, host: str = "127.0.0.1", port: int | None = None) -> str:
        return f"https://alice:hunter2@{host}:{port or self.port}{path}?sig=s3cr3t"


@pytest_asyncio.fixture
async def origin(tmp_path: Path) -> AsyncIterator[Origin]:
    cert, key = self_signed_certificate(tmp_path / "tls")
    model = make_gguf(tmp_path / "served.gguf")
    fetched: dict[str, int] = {}
    closing = asyncio.Event()
    made = Origin(0, cert, fetched)

    async def serve(request: web.Request) -> web.StreamResponse:
        fetched[request.path] = fetched.get(request.path, 0) + 1
        if request.path == "/models/tiny.gguf":
            return web.Response(body=model)
        if request.path == "/models/slow.gguf":
            response = web.StreamResponse(headers={"Content-Length": str(len(model))})
            await response.prepare(request)
            await response.write(model[: len(model) // 2])
            await made.release.wait()
            await response.write(model[len(model) // 2 :])
            return response
        if request.path == "/models/huge.gguf":  # says 10 GiB; sends nothing more
            response = web.StreamResponse(headers={"Content-Length": str(10 << 30)})
            await response.prepare(request)
            await closing.wait()
            return response
        if request.path == "/models/endless.gguf":  # no length; never ends
            response = web.StreamResponse()
            await response.prepare(request)
            try:
                while not closing.is_set():
                    await response.write(b"\0" * 65536)
            except ConnectionResetError:
                pass  # the agent cut it
            return response
        if request.path == "/redirect/metadata.gguf":
            raise web.HTTPFound("https://169.254.169.254/latest/meta-data/m.gguf")
        if request.path == "/redirect/plain.gguf":
            raise web.HTTPFound(f"http://127.0.0.1:{made.port}/models/tiny.gguf")
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_side)
    await site.start()
    made.port = runner.addresses[0][1]
    try:
        yield made
    finally:
        closing.set()
        made.release.set()
        await runner.cleanup()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unported(reason: str, *hosts: str) -> str:
    """A reason with its ports and hosts made the same, to compare two reasons' words."""
    for host in hosts:
        reason = reason.replace(host, "HOST")
    return re.sub(r":[0-9]+", ":PORT", reason)


# --- which addresses -------------------------------------------------------------------------


def test_only_public_addresses_are_reached_unless_the_owner_allows_a_network() -> None:
    strict = DownloadPolicy()
    for address in ("8.8.8.8", "2606:4700:4700::1111", "151.101.1.69"):
        assert strict.permits(ip_address(address)), address
    for address in (
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # the cloud's metadata service
        "fe80::1",
        "fc00::1",
        "fd12::1",
        "100.64.0.1",  # shared address space (carrier NAT)
        "0.0.0.0",  # noqa: S104 (an address judged here, not bound)
        "::",
        "224.0.0.1",  # multicast (which Python counts as global)
        "ff02::1",
        "240.0.0.1",
        "255.255.255.255",
        "::ffff:127.0.0.1",  # IPv4 inside IPv6 is judged as itself
        "::ffff:10.0.0.1",
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    ):
        assert not strict.permits(ip_address(address)), address
    lab = DownloadPolicy(allow=(ip_network("10.20.0.0/16"), ip_network("::1/128")))
    assert lab.permits(ip_address("10.20.3.4"))
    assert lab.permits(ip_address("::1"))
    assert not lab.permits(ip_address("10.21.0.1"))
    assert not lab.permits(ip_address("169.254.169.254"))


def test_the_owners_settings_make_the_policy() -> None:
    from einsora.common.errors import ConfigError
    from einsora.common.settings import Settings

    policy = DownloadPolicy.of(
        Settings(
            agent_download_allow="10.0.0.0/8, fd00::/8",
            agent_model_download_max_gib=2,
            agent_image_download_max_gib=0.5,
        )
    )
    assert policy.allow == (ip_network("10.0.0.0/8"), ip_network("fd00::/8"))
    assert (policy.model_max_bytes, policy.image_max_bytes) == (2 << 30, 1 << 29)
    with pytest.raises(ConfigError, match="agent_download_allow"):
        DownloadPolicy.of(Settings(agent_download_allow="10.0.0.0/8,not-a-network"))


# --- through the agent, as it is set up by default --------------------------------------------


async def test_a_download_from_this_machine_is_refused_alike_whatever_listens(
    control: ControlPlane, start_agent: StartAgent, origin: Origin
) -> None:
    """Loopback (an address, or a name resolving to it), a port that is open and one that is
    closed, and the cloud's metadata address: refused before any connection, in the same
    words, without the URI's secrets."""
    await start_agent(machine_id="m-dl1")
    closed = closed_port()
    models = {
        "w-open": origin.url("/models/tiny.gguf"),
        "w-closed": origin.url("/models/tiny.gguf", port=closed),
        "w-name": origin.url("/models/tiny.gguf", host="localhost"),
        "w-meta": origin.url("/models/tiny.gguf", host="169.254.169.254", port=443),
    }
    await control.put_desired("m-dl1", 1, [endpoint(w, m) for w, m in models.items()])
    state = await control.wait_observed(
        "m-dl1",
        lambda s: (
            len(s.workloads) == 4 and all(w.phase is ObservedPhase.failed for w in s.workloads)
        ),
    )
    reasons = {w.workload_id: w.reason for w in state.workloads}
    assert origin.fetched == {}  # nothing reached the origin
    assert "cannot be reached from this machine" in reasons["w-open"]
    words = {unported(r, "127.0.0.1", "localhost", "169.254.169.254") for r in reasons.values()}
    assert len(words) == 1, reasons
    for reason in reasons.values():
        assert "hunter2" not in reason
        assert "s3cr3t" not in reason


# --- through `einsora agent`, with its owner's settings ---------------------------------------


@dataclass
class AgentProcess:
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log: Path


@pytest.fixture
def owners_agent(bus: Bus, origin: Origin, tmp_path: Path) -> Iterator[AgentProcess]:
    """`einsora agent` (machine m-dl2) whose owner allows downloads from loopback and caps a
    model at 1 MiB, trusting the origin's certificate."""
    data_dir = tmp_path / "agent"
    log = tmp_path / "agent.log"
    argv = [
        str(Path(sys.executable).parent / "einsora"),
        "agent",
        "--nats",
        bus.url,
        "--machine-id",
        "m-dl2",
        "--data-dir",
        str(data_dir),
        "--heartbeat",
        "0.5",
        "--no-docker",
        "--no-libvirt",
    ]
    env = subprocess_env(
        EINSORA_LOG_FORMAT="text",
        EINSORA_AGENT_DOWNLOAD_ALLOW="127.0.0.0/8",
        EINSORA_AGENT_MODEL_DOWNLOAD_MAX_GIB=str(1 / 1024),
        SSL_CERT_FILE=str(origin.cert),
    )
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        yield AgentProcess(proc, data_dir, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def test_an_allowed_download_shows_its_progress_and_is_kept(
    control: ControlPlane, owners_agent: AgentProcess, origin: Origin
) -> None:
    await control.put_desired("m-dl2", 1, [endpoint("w-slow", origin.url("/models/slow.gguf"))])
    seen = await control.wait_workload(
        "m-dl2", "w-slow", lambda w: PROGRESS.search(w.reason) is not None, within_s=30
    )
    assert seen.phase is ObservedPhase.starting
    assert "hunter2" not in seen.reason
    assert "s3cr3t" not in seen.reason
    origin.release.set()
    done = await control.wait_workload(
        "m-dl2", "w-slow", lambda w: w.phase is ObservedPhase.failed, within_s=30
    )
    assert "needs an NVIDIA GPU" in done.reason  # the model passed; only then its runtime
    kept = list((owners_agent.data_dir / "models").iterdir())
    assert [p.name.endswith("-slow.gguf") for p in kept] == [True]
    assert origin.fetched["/models/slow.gguf"] == 1
    logged = owners_agent.log.read_text()
    assert "downloading" in logged
    assert "hunter2" not in logged
    assert "s3cr3t" not in logged


async def test_a_download_over_the_cap_is_refused_or_cut(
    control: ControlPlane, owners_agent: AgentProcess, origin: Origin
) -> None:
    await control.put_desired(
        "m-dl2",
        1,
        [
            endpoint("w-huge", origin.url("/models/huge.gguf")),
            endpoint("w-endless", origin.url("/models/endless.gguf")),
        ],
    )
    state = await control.wait_observed(
        "m-dl2",
        lambda s: (
            len(s.workloads) == 2 and all(w.phase is ObservedPhase.failed for w in s.workloads)
        ),
        within_s=30,
    )
    reasons = {w.workload_id: w.reason for w in state.workloads}
    assert "is 10.0 GiB, over this machine's limit of 1.0 MiB" in reasons["w-huge"]
    assert "over this machine's limit of 1.0 MiB" in reasons["w-endless"]
    assert "cut" in reasons["w-endless"]
    models = owners_agent.data_dir / "models"
    assert list(models.iterdir()) == []  # the cut download's partial file was removed


async def test_every_redirect_is_checked_again(
    control: ControlPlane, owners_agent: AgentProcess, origin: Origin
) -> None:
    await control.put_desired(
        "m-dl2",
        1,
        [
            endpoint("w-meta", origin.url("/redirect/metadata.gguf")),
            endpoint("w-plain", origin.url("/redirect/plain.gguf")),
        ],
    )
    state = await control.wait_observed(
        "m-dl2",
        lambda s: (
            len(s.workloads) == 2 and all(w.phase is ObservedPhase.failed for w in s.workloads)
        ),
        within_s=30,
    )
    reasons = {w.workload_id: w.reason for w in state.workloads}
    assert "169.254.169.254 cannot be reached from this machine" in reasons["w-meta"]
    assert "redirected off https" in reasons["w-plain"]
    assert "/models/tiny.gguf" not in origin.fetched
