"""Pytest fixtures shared by every package's tests (loaded as the `einsora` pytest plugin).

Real servers, never mocks: a real `nats-server` on a free port with a temporary store, which a
test can stop, kill and restart; a fresh SQLite file per test. Postgres fixtures live in
`einsora.store.testing`, beside the store they exercise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from einsora.common.bus import bind_bucket, connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import Enrolment, SharingLevel, utcnow


@dataclass
class Bus:
    """A connected client on a provisioned server."""

    nc: NATS
    js: JetStreamContext
    url: str


@pytest.fixture(scope="session", autouse=True)
def _default_data_dir_is_the_sessions(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """No test writes to the real `~/.local/share/einsora`: a service built without a data dir
    (and any subprocess a test starts) uses one of the session's own; nor binds the real
    tunnel port."""
    patch = pytest.MonkeyPatch()
    patch.setenv("EINSORA_DATA_DIR", str(tmp_path_factory.mktemp("default-data-dir")))
    # Every proxy runs a tunnel hub: on a free port, so tests (and test runs) never collide.
    patch.setenv("EINSORA_TUNNEL_PORT", "0")
    yield
    patch.undo()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """One real nats-server for the whole test session (do not stop it; see `own_nats_server`)."""
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"), port=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A real nats-server for one test, which it may stop, kill and restart on the same port."""
    server = EmbeddedNats(tmp_path / "nats", port=0)
    server.start()
    yield server
    server.stop()


async def _purge_all(js: JetStreamContext) -> None:
    for stream in [s.name for s in names.STREAMS] + [b.stream for b in names.BUCKETS]:
        with contextlib.suppress(NotFoundError):
            await js.purge_stream(stream)
        # Consumers left by a test would see the next test's messages.
        try:
            for info in await js.consumers_info(stream):
                await js.delete_consumer(stream, info.name)
        except NotFoundError:
            pass


@pytest_asyncio.fixture
async def bus(nats_server: EmbeddedNats) -> AsyncIterator[Bus]:
    """A client of the session's server, provisioned, with every stream and bucket empty."""
    nc = await connect(nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    await _purge_all(js)
    try:
        yield Bus(nc, js, nats_server.url)
    finally:
        await nc.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite database file for one test."""
    return f"sqlite+aiosqlite:///{tmp_path / 'einsora.db'}"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty Einsora data dir for one test."""
    path = tmp_path / "data"
    path.mkdir()
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a service started as a subprocess by a test."""
    env = dict(os.environ)
    env.update(extra)
    return env


async def until(condition: Callable[[], object], within_s: float = 15.0, what: str = "") -> None:
    """Wait until `condition()` is truthy, for state with no event to wait on (a mirror fed
    by the bus, say): re-checked every 20 ms, an AssertionError after `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not true within {within_s} s: {what or condition}")
        await asyncio.sleep(0.02)


async def enrol(
    js: JetStreamContext,
    machine_id: str,
    *,
    region: str = "local",
    owner_tenant_id: str = "t-owner",
    tunnel: bool = False,
    revoked: bool = False,
    sharing: SharingLevel = SharingLevel.private,
    guests: tuple[str, ...] = (),
    **fields: Any,
) -> Enrolment:
    """Enrol a machine the way the api does (its record in the `enrolments` bucket), for tests
    that play the api: the scheduler counts only enrolled machines. `fields`: the enrolment's
    other fields (a lend, a reclaim grace…)."""
    enrolment = Enrolment.model_validate(
        {
            "machine_id": machine_id,
            "owner_tenant_id": owner_tenant_id,
            "region": region,
            "sharing": sharing,
            "guests": list(guests),
            "tunnel": tunnel,
            # A direct machine here is on this host, as the control plane's own are.
            "address": None if tunnel else "127.0.0.1",
            "revoked_at": utcnow() if revoked else None,
            **fields,
        }
    )
    kv = bind_bucket(js, names.ENROLMENTS)
    await kv.put(names.enrolment_key(machine_id), enrolment.to_bytes())
    return enrolment


class ManualClock:
    """A wall clock a test moves on (for code that takes a `clock` returning aware datetimes)."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A fresh self-signed TLS certificate for `localhost` and 127.0.0.1 (valid a day), written
    as `tls.crt` and `tls.key` (0600) under `directory`: (certificate file, key file)."""
    import datetime
    import ipaddress

    # Imported here: the harness loads for every package's tests; cryptography comes with
    # asyncssh, which the agent and the proxy depend on.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "einsora-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file
