"""Joining: the enrolment file (0600 in a 0700 dir, replaced atomically, never overwritten
without --force), the exchange with the api (over plain HTTP, and over TLS with a pinned
certificate), and the CA it names for a `tls://` NATS.

The api's `POST /v1/machines/join` is served here by a tiny aiohttp app on a real socket that
answers exactly the contract: it stands in for the api's route, which is being written at the
same time, so the agent's side is tested without importing another service.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from einsora.agent.join import (
    ApiRefused,
    Enrolled,
    TunnelEndpoint,
    enrolment_path,
    host_key_line,
    join,
    load_enrolment,
    save_enrolment,
    tunnel_host_key_path,
)
from einsora.agent.service import AgentService
from einsora.common.bus import bind_bucket, connect, names, provision
from einsora.common.embedded_nats import nats_server_binary
from einsora.common.errors import ConfigError, EinsoraError
from einsora.common.schemas import ObservedPhase, WorkloadKind
from einsora.common.settings import Settings
from einsora.common.testing import Bus, self_signed_certificate, subprocess_env
from einsora.testing.agent import ControlPlane

TOKEN = "agt_" + "5" * 40
CREDENTIAL = "agk_" + "7" * 40


def enrolled(machine_id: str = "m-one", credential: str = CREDENTIAL) -> Enrolled:
    return Enrolled.model_validate(
        {
            "machine_id": machine_id,
            "credential": credential,
            "owner_tenant_id": "t-owner",
            "region": "home",
            "sharing": "private",
            "api_url": "http://127.0.0.1:1",
            "nats_url": "nats://127.0.0.1:1",
            "hostname": "box",
        }
    )


# --- the file -------------------------------------------------------------------------------


def test_the_enrolment_is_private_and_reads_back(data_dir: Path) -> None:
    path = save_enrolment(data_dir, enrolled())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    back = load_enrolment(data_dir)
    assert back is not None
    assert back.machine_id == "m-one"
    assert back.credential.get_secret_value() == CREDENTIAL
    # Printing or logging the model never shows the credential.
    assert CREDENTIAL not in repr(back)
    assert CREDENTIAL not in str(back)


def test_a_machine_that_never_joined_has_no_enrolment(data_dir: Path) -> None:
    assert load_enrolment(data_dir) is None


def test_an_unreadable_enrolment_is_an_error_naming_the_file(data_dir: Path) -> None:
    path = enrolment_path(data_dir)
    path.parent.mkdir(parents=True)
    path.write_text('{"machine_id": "m-one"')
    with pytest.raises(ConfigError, match=str(path)):
        load_enrolment(data_dir)


def test_the_enrolment_is_replaced_atomically(data_dir: Path) -> None:
    """A reader holding the old file reads it whole; the path then holds the new one, and no
    partial file is left beside it."""
    path = save_enrolment(data_dir, enrolled("m-old"))
    with path.open() as old:
        save_enrolment(data_dir, enrolled("m-new"))
        assert json.loads(old.read())["machine_id"] == "m-old"
    back = load_enrolment(data_dir)
    assert back is not None
    assert back.machine_id == "m-new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["enrolment.json"]


async def test_joining_again_is_refused_without_force_and_names_the_machine(
    data_dir: Path,
) -> None:
    save_enrolment(data_dir, enrolled("m-first"))
    with pytest.raises(ConfigError, match=r"m-first.*--force"):
        await join(data_dir, "http://127.0.0.1:1", TOKEN)
    back = load_enrolment(data_dir)
    assert back is not None
    assert back.machine_id == "m-first"


# --- the exchange, against a stand-in for the api's route ----------------------------------------


@dataclass
class StandIn:
    """The api's join route: what it was sent, and what it answers."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 201
    machine_id: str = "m-joined"
    tunnel: bool = True


def _app(stand_in: StandIn) -> web.Application:
    async def join_route(request: web.Request) -> web.Response:
        body = await request.json()
        stand_in.requests.append(
            {"body": body, "authorization": request.headers.get("authorization")}
        )
        if stand_in.status == 401:
            # The api's error body (services/api/src/einsora/api/errors.py).
            return web.json_response(
                {
                    "error": "join_token_invalid",
                    "message": "this join token is unknown, used up or expired",
                    "request_id": "req-1",
                    "details": [],
                },
                status=401,
            )
        return web.json_response(
            {
                "machine_id": stand_in.machine_id,
                "credential": CREDENTIAL,
                "region": "home",
                "owner_tenant_id": "t-owner",
                "sharing": "private",
                "nats_url": "nats://127.0.0.1:4222",
                "nats_ca_pem": None,
                "tunnel": {"host": "127.0.0.1", "port": 8083, "hub_key": "ssh-ed25519 AAAA hub"}
                if stand_in.tunnel
                else None,
                "api_url": stand_in.url,
            },
            status=stand_in.status,
        )

    app = web.Application()
    app.router.add_post("/v1/machines/join", join_route)
    return app


async def _serve(app: web.Application, tls: ssl.SSLContext | None = None) -> TestServer:
    server = TestServer(app, host="127.0.0.1", scheme="https" if tls else "http")
    await server.start_server(ssl=tls)
    return server


@pytest_asyncio.fixture
async def api() -> AsyncIterator[StandIn]:
    stand_in = StandIn(url="")
    server = await _serve(_app(stand_in))
    stand_in.url = str(server.make_url("")).rstrip("/")
    try:
        yield stand_in
    finally:
        await server.close()


async def test_join_stores_the_machine_and_sends_the_token_in_the_body_only(
    api: StandIn, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    got = await join(data_dir, api.url, TOKEN, hostname="gpu-box")
    assert got.machine_id == "m-joined"
    assert got.owner_tenant_id == "t-owner"
    assert got.tunnel is not None
    assert got.tunnel.port == 8083
    [sent] = api.requests
    assert sent["body"]["token"] == TOKEN
    assert sent["body"]["hostname"] == "gpu-box"
    assert sent["authorization"] is None
    # The tunnel key is the public line of a host key kept 0600 beside the enrolment.
    assert sent["body"]["tunnel_key"].startswith("ssh-ed25519 ")
    key = tunnel_host_key_path(data_dir)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    stored = load_enrolment(data_dir)
    assert stored is not None
    assert stored.credential.get_secret_value() == CREDENTIAL
    assert stored.api_url == api.url
    logged = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert TOKEN not in logged
    assert CREDENTIAL not in logged


async def test_force_replaces_an_enrolment(api: StandIn, data_dir: Path) -> None:
    save_enrolment(data_dir, enrolled("m-first"))
    got = await join(data_dir, api.url, TOKEN, force=True)
    assert got.machine_id == "m-joined"
    back = load_enrolment(data_dir)
    assert back is not None
    assert back.machine_id == "m-joined"


async def test_a_refused_token_says_why_and_writes_nothing(api: StandIn, data_dir: Path) -> None:
    api.status = 401
    with pytest.raises(ApiRefused, match="refused the join token: this join token is unknown") as e:
        await join(data_dir, api.url, TOKEN)
    assert e.value.code == "join_token_invalid"
    assert api.url in e.value.message
    assert TOKEN not in e.value.message
    assert load_enrolment(data_dir) is None


async def test_a_token_of_another_kind_is_refused_before_anything_is_sent(
    api: StandIn, data_dir: Path
) -> None:
    with pytest.raises(ConfigError, match="starts with agt_"):
        await join(data_dir, api.url, "tsk_" + "1" * 40)
    assert api.requests == []


async def test_an_unreachable_api_is_named(data_dir: Path, unused_tcp_port: int) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
    with pytest.raises(EinsoraError, match=f"cannot reach the api at {url}"):
        await join(data_dir, url, TOKEN)


# --- TLS: a pinned certificate instead of CA trust ---------------------------------------------


@dataclass
class Certificate:
    context: ssl.SSLContext
    fingerprint: str
    pem: str
    cert_file: Path
    key_file: Path


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """A self-signed certificate for 127.0.0.1, as a Lab without a public CA would have."""
    cert_file, key_file = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    der = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
    return Certificate(
        context,
        "sha256:" + hashlib.sha256(der).hexdigest(),
        cert_file.read_text(),
        cert_file,
        key_file,
    )


@pytest_asyncio.fixture
async def tls_api(certificate: Certificate) -> AsyncIterator[StandIn]:
    stand_in = StandIn(url="")
    server = await _serve(_app(stand_in), certificate.context)
    stand_in.url = str(server.make_url("")).rstrip("/")
    assert stand_in.url.startswith("https://")
    try:
        yield stand_in
    finally:
        await server.close()


async def test_a_pinned_certificate_is_trusted_without_a_ca(
    tls_api: StandIn, certificate: Certificate, data_dir: Path
) -> None:
    # Upper case with colons, as `openssl x509 -fingerprint` prints it, is the same pin.
    digest = certificate.fingerprint.split(":", 1)[1].upper()
    openssl_style = "sha256:" + ":".join(digest[i : i + 2] for i in range(0, 64, 2))
    got = await join(data_dir, tls_api.url, TOKEN, fingerprint=openssl_style)
    assert got.api_fingerprint == certificate.fingerprint


async def test_another_certificate_than_the_pinned_one_is_refused(
    tls_api: StandIn, data_dir: Path
) -> None:
    with pytest.raises(ConfigError, match="does not match the pinned fingerprint"):
        await join(data_dir, tls_api.url, TOKEN, fingerprint="sha256:" + "ab" * 32)
    assert tls_api.requests == []
    assert load_enrolment(data_dir) is None


async def test_an_unpinned_self_signed_certificate_is_not_trusted(
    tls_api: StandIn, data_dir: Path
) -> None:
    with pytest.raises(ConfigError, match=r"not trusted.*--fingerprint"):
        await join(data_dir, tls_api.url, TOKEN)
    assert tls_api.requests == []


async def test_a_pin_on_plain_http_is_refused(api: StandIn, data_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not https"):
        await join(data_dir, api.url, TOKEN, fingerprint="sha256:" + "ab" * 32)
    assert api.requests == []


@pytest.fixture
def tls_nats(certificate: Certificate, tmp_path: Path) -> Iterator[str]:
    """A nats-server that speaks only TLS, with the self-signed certificate, and a token."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "nats.log"
    config = tmp_path / "nats.conf"
    config.write_text(
        f"""listen: "127.0.0.1:{port}"
log_file: "{log}"
jetstream {{ store_dir: "{tmp_path / "js"}" }}
tls {{ cert_file: "{certificate.cert_file}", key_file: "{certificate.key_file}" }}
authorization {{ token: "{CREDENTIAL}" }}
"""
    )
    proc = subprocess.Popen([str(nats_server_binary()), "-c", str(config)])
    deadline = time.monotonic() + 10
    while "Server is ready" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, "nats-server exited at start"
        assert time.monotonic() < deadline, "nats-server did not start within 10 s"
        time.sleep(0.01)
    try:
        yield f"tls://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_an_enrolled_agent_trusts_the_nats_ca_its_enrolment_names(
    tls_nats: str, certificate: Certificate, data_dir: Path
) -> None:
    trust = ssl.create_default_context(cadata=certificate.pem)
    admin = await connect(tls_nats, name="test-scheduler", token=CREDENTIAL, tls=trust)
    await provision(admin.jetstream())
    control = ControlPlane(admin, bind_bucket(admin.jetstream(), names.MACHINES))
    machine = enrolled("m-tls").model_copy(
        update={"nats_url": tls_nats, "nats_ca_pem": certificate.pem}
    )
    agent = AgentService(Settings(data_dir=data_dir), enrolment=machine, driver="sim")
    await agent.start()
    try:
        await control.put_desired("m-tls", 1, [control.workload("w-a")])
        await control.wait_workload("m-tls", "w-a", lambda w: w.phase is ObservedPhase.running)
    finally:
        await agent.stop()
        await admin.close()


async def test_a_tunnelled_machine_lets_the_hub_reach_its_workloads_only(
    bus: Bus, control: ControlPlane, data_dir: Path
) -> None:
    """The enrolment's tunnel is dialed with the host key made at join; through it, the hub
    (a real asyncssh client built here, standing in for the proxy's) reaches the port of this
    machine's endpoint, and nothing else."""
    host_key = host_key_line(tunnel_host_key_path(data_dir))  # as `join` makes it
    hub_key = asyncssh.generate_private_key("ssh-ed25519")
    accepted: asyncio.Queue[asyncssh.SSHClientConnection] = asyncio.Queue()
    hub = await asyncssh.listen_reverse(
        "127.0.0.1",
        0,
        acceptor=accepted.put_nowait,
        config=None,
        username="hub",
        client_keys=[hub_key],
        known_hosts=([asyncssh.import_public_key(host_key)], [], []),
    )
    tunnel = {
        "host": "127.0.0.1",
        "port": hub.get_port(),
        "hub_key": hub_key.export_public_key().decode(),
    }
    machine = enrolled("m-tun").model_copy(
        update={"nats_url": bus.url, "tunnel": TunnelEndpoint.model_validate(tunnel)}
    )
    agent = AgentService(Settings(data_dir=data_dir), enrolment=machine, driver="sim")
    await agent.start()
    try:
        endpoint = control.workload("w-ep", kind=WorkloadKind.endpoint, spec={})
        await control.put_desired("m-tun", 1, [endpoint])
        running = await control.wait_workload(
            "m-tun", "w-ep", lambda w: w.phase is ObservedPhase.running and w.endpoint is not None
        )
        assert running.endpoint is not None
        conn = await asyncio.wait_for(accepted.get(), 20)
        reader, writer = await conn.open_connection("127.0.0.1", running.endpoint.port)
        writer.write(b"GET /v1/models HTTP/1.0\r\nHost: w-ep\r\n\r\n")
        status = await asyncio.wait_for(reader.readline(), 10)
        assert status.startswith(b"HTTP/1.0 200") or status.startswith(b"HTTP/1.1 200")
        writer.close()
        # Another port on the machine (its NATS here) is not a workload's: refused.
        nats_port = int(bus.url.rsplit(":", 1)[1])
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.open_connection("127.0.0.1", nats_port)
    finally:
        await agent.stop()
        hub.close()


# --- the command ----------------------------------------------------------------------------------


async def test_the_join_command_prints_the_machine_and_never_the_credential(
    api: StandIn, data_dir: Path
) -> None:
    env = subprocess_env(EINSORA_DATA_DIR=str(data_dir), EINSORA_LOG_FORMAT="text")
    # `--token -`: the token from stdin, out of the shell's history and of `ps`.
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "einsora.agent", "join", api.url, "--token", "-"),
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(f"{TOKEN}\n".encode()), 60)
    assert proc.returncode == 0, err.decode()
    assert api.requests[0]["body"]["token"] == TOKEN
    text = out.decode()
    assert "machine m-joined" in text
    assert "owner t-owner" in text
    assert "region home" in text
    assert CREDENTIAL not in text + err.decode()
    assert TOKEN not in text + err.decode()
    stored = load_enrolment(data_dir)
    assert stored is not None
    assert stored.machine_id == "m-joined"

    # Again, without --force: refused, naming the machine, and exit status 1.
    again = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "einsora.agent",
        "join",
        api.url,
        "--token",
        TOKEN,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(again.communicate(), 60)
    assert again.returncode == 1
    assert "m-joined" in err.decode()
    assert "--force" in err.decode()
