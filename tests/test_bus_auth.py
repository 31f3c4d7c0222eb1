"""The local bus takes no stranger (issue 9, hole 2; ADR-0009).

Before, any local user could connect to Solo's NATS, read the `routes` bucket (workloads'
tokens in clear), answer `access.redeem` itself, and write a machine's `desired` key. Here a
real nats-server runs with exactly the authorization Solo writes: a client without credentials,
or with credentials the server does not know, is refused, and each service identity is refused
outside its subjects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from einsora.common.bus import accounts, bind_bucket, connect, identities, names, provision
from einsora.common.bus.identities import Identity
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.errors import ConfigError

MACHINE = "m-auth1"
OTHER_MACHINE = "m-auth2"
DENIED_WAIT_S = 0.5


@dataclass
class Identities:
    server: EmbeddedNats
    by_name: dict[str, Identity]


@pytest.fixture
def locked_bus(tmp_path: Path) -> Iterator[Identities]:
    """A nats-server with Solo's users: api, scheduler, proxy and one machine's agent."""
    credentials = tmp_path / "bus"
    users = {
        name: (identities.ensure_identity(credentials, name), identities.service_permissions(name))
        for name in (identities.API, identities.SCHEDULER, identities.PROXY)
    }
    users[MACHINE] = (
        identities.ensure_identity(credentials, MACHINE),
        identities.agent_permissions(MACHINE),
    )
    # The accounts layout Solo writes (ControlPlane._authorization): static users plus the
    # auth callout for machines from elsewhere (none answers it here, so they are refused).
    conf = accounts.server_auth_conf(
        users,
        callout=identities.ensure_identity(credentials, identities.CALLOUT),
        system=identities.ensure_identity(credentials, identities.SYSTEM),
        issuer_public_key=identities.ensure_issuer(credentials).public_key,
    )
    server = EmbeddedNats(
        tmp_path / "nats", port=0, authorization=conf, app_account=accounts.APP_ACCOUNT
    )
    server.start()
    try:
        yield Identities(server, {name: ident for name, (ident, _) in users.items()})
    finally:
        server.stop()


@dataclass
class Client:
    """A raw client that records the server's permission violations."""

    nc: NATS
    errors: list[str] = field(default_factory=list)

    def refused(self, subject: str) -> bool:
        # nats-py lower-cases the server's -ERR text.
        wanted = subject.lower()
        return any(
            "permissions violation" in e.lower() and wanted in e.lower() for e in self.errors
        )


@pytest_asyncio.fixture
async def clients(locked_bus: Identities) -> AsyncIterator[dict[str, Client]]:
    made: dict[str, Client] = {}
    for name, ident in locked_bus.by_name.items():
        client = Client(nc=None)  # type: ignore[arg-type]

        async def on_error(exc: Exception, client: Client = client) -> None:
            client.errors.append(str(exc))

        client.nc = await nats.connect(
            locked_bus.server.url,
            nkeys_seed_str=ident.seed,
            inbox_prefix=identities.inbox_prefix(name),
            error_cb=on_error,
            allow_reconnect=False,
        )
        made[name] = client
    await provision(made[identities.SCHEDULER].nc.jetstream())
    try:
        yield made
    finally:
        for client in made.values():
            with contextlib.suppress(Exception):
                await client.nc.close()


async def _refused(client: Client, subject: str) -> bool:
    """Whether the server refused `client` on `subject` (its -ERR arrives within the wait)."""
    deadline = asyncio.get_running_loop().time() + DENIED_WAIT_S * 4
    while asyncio.get_running_loop().time() < deadline:
        if client.refused(subject):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_client_without_credentials_is_refused(locked_bus: Identities) -> None:
    with pytest.raises(ConfigError, match="refused a client without credentials"):
        await connect(locked_bus.server.url, name="stranger", startup_timeout=3)


async def test_unknown_credentials_are_refused(locked_bus: Identities, tmp_path: Path) -> None:
    stranger = identities.ensure_identity(tmp_path / "elsewhere", identities.API)
    with pytest.raises(ConfigError, match="refused api"):
        await connect(
            locked_bus.server.url, name="stranger", credentials=stranger, startup_timeout=3
        )
    # The real identity connects.
    real = await connect(
        locked_bus.server.url, name="api", credentials=locked_bus.by_name[identities.API]
    )
    await real.close()


async def test_only_the_proxy_reads_routes(clients: dict[str, Client]) -> None:
    scheduler = clients[identities.SCHEDULER]
    routes_w = bind_bucket(scheduler.nc.jetstream(), names.ROUTES)
    await routes_w.put("w-secret", b'{"token": "jupyter-token"}')
    # The proxy reads it.
    proxy_kv = bind_bucket(clients[identities.PROXY].nc.jetstream(), names.ROUTES)
    assert (await proxy_kv.get("w-secret")).value == b'{"token": "jupyter-token"}'
    # The api, the agent and the scheduler itself may not read a value.
    read = "$JS.API.DIRECT.GET.KV_routes.$KV.routes.w-secret"
    for who in (identities.API, MACHINE, identities.SCHEDULER):
        client = clients[who]
        kv = bind_bucket(client.nc.jetstream(), names.ROUTES)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(kv.get("w-secret"), DENIED_WAIT_S)
        assert await _refused(client, read), (who, client.errors)


async def test_only_the_scheduler_writes_desired_state(clients: dict[str, Client]) -> None:
    key = names.desired_key(MACHINE)
    subject = names.MACHINES.key_subject(key)
    scheduler_kv = bind_bucket(clients[identities.SCHEDULER].nc.jetstream(), names.MACHINES)
    await scheduler_kv.put(key, b'{"generation": 1}')
    for who in (identities.API, identities.PROXY, MACHINE):
        client = clients[who]
        kv = bind_bucket(client.nc.jetstream(), names.MACHINES)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(kv.put(key, b'{"run": "as root"}'), DENIED_WAIT_S)
        assert await _refused(client, subject), (who, client.errors)
    # What the agent reads is still the scheduler's.
    agent_kv = bind_bucket(clients[MACHINE].nc.jetstream(), names.MACHINES)
    assert (await agent_kv.get(key)).value == b'{"generation": 1}'


async def test_only_the_api_answers_access_redeem(clients: dict[str, Client]) -> None:
    answered_by: list[str] = []

    def responder(who: str):  # type: ignore[no-untyped-def]
        async def on(msg: Msg) -> None:
            answered_by.append(who)
            await msg.respond(f"ok from {who}".encode())

        return on

    await clients[identities.API].nc.subscribe(
        names.ACCESS_REDEEM_SUBJECT, queue=names.API_QUEUE_GROUP, cb=responder("api")
    )
    for who in (identities.PROXY, identities.SCHEDULER, MACHINE):
        client = clients[who]
        await client.nc.subscribe(names.ACCESS_REDEEM_SUBJECT, cb=responder(who))
        assert await _refused(client, names.ACCESS_REDEEM_SUBJECT), (who, client.errors)
    for _ in range(5):
        reply = await clients[identities.PROXY].nc.request(
            names.ACCESS_REDEEM_SUBJECT, b"{}", timeout=2
        )
        assert reply.data == b"ok from api"
    assert set(answered_by) == {"api"}
    # Nobody but the proxy asks: the agent may not even publish there.
    agent = clients[MACHINE]
    with contextlib.suppress(Exception):
        await agent.nc.request(names.ACCESS_REDEEM_SUBJECT, b"{}", timeout=DENIED_WAIT_S)
    assert await _refused(agent, names.ACCESS_REDEEM_SUBJECT)


async def test_an_agent_reaches_its_own_keys_only(clients: dict[str, Client]) -> None:
    scheduler_kv = bind_bucket(clients[identities.SCHEDULER].nc.jetstream(), names.MACHINES)
    await scheduler_kv.put(names.desired_key(OTHER_MACHINE), b'{"secret": "theirs"}')
    agent = clients[MACHINE]
    kv = bind_bucket(agent.nc.jetstream(), names.MACHINES)
    await kv.put(names.observed_key(MACHINE), b"{}")
    other = names.MACHINES.key_subject(names.desired_key(OTHER_MACHINE))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(kv.get(names.desired_key(OTHER_MACHINE)), DENIED_WAIT_S)
    assert await _refused(agent, f"$JS.API.DIRECT.GET.KV_machines.{other}")
    observed_other = names.MACHINES.key_subject(names.observed_key(OTHER_MACHINE))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(kv.put(names.observed_key(OTHER_MACHINE), b"{}"), DENIED_WAIT_S)
    assert await _refused(agent, observed_other)


async def test_no_service_may_purge_or_delete_the_history(clients: dict[str, Client]) -> None:
    for who in (identities.API, identities.SCHEDULER, identities.PROXY):
        client = clients[who]
        js = client.nc.jetstream()
        for stream in (names.EVENTS.name, names.MACHINES.stream):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(js.purge_stream(stream), DENIED_WAIT_S)
            assert await _refused(client, f"$JS.API.STREAM.PURGE.{stream}"), (who, stream)
    info = await clients[identities.SCHEDULER].nc.jetstream().stream_info(names.MACHINES.stream)
    assert info.config.name == names.MACHINES.stream


def test_the_seeds_are_private(locked_bus: Identities, tmp_path: Path) -> None:
    directory = tmp_path / "bus"
    assert directory.stat().st_mode & 0o777 == 0o700
    for path in directory.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    config = locked_bus.server.config_file
    assert config.stat().st_mode & 0o777 == 0o600
    text = config.read_text()
    for ident in locked_bus.by_name.values():
        assert ident.public_key in text
        assert ident.seed not in text


async def test_region_statuses_and_hand_overs_are_the_schedulers(
    clients: dict[str, Client],
) -> None:
    """ADR-0022: a scheduler puts its region's status and hands workloads over to another
    region's intent subject; the api reads the statuses and writes model fallbacks; an agent
    does none of it."""
    status = b'{"region": "office", "at": "2026-12-01T00:00:00Z", "period_s": 5}'
    scheduler = clients[identities.SCHEDULER]
    await bind_bucket(scheduler.nc.jetstream(), names.REGIONS).put("office", status)
    ack = await scheduler.nc.jetstream().publish(
        names.intent_subject("office", "w-handed"), b"{}", timeout=2
    )
    assert ack.stream == names.INTENTS.name
    api = clients[identities.API]
    assert (await bind_bucket(api.nc.jetstream(), names.REGIONS).get("office")).value == status
    await bind_bucket(api.nc.jetstream(), names.MODEL_FALLBACKS).put("w-endpoint", b"{}")
    refusals = [
        (identities.API, names.REGIONS.key_subject("office")),
        (MACHINE, names.REGIONS.key_subject("office")),
        (identities.SCHEDULER, names.MODEL_FALLBACKS.key_subject("w-endpoint")),
        (MACHINE, names.MODEL_FALLBACKS.key_subject("w-endpoint")),
    ]
    for who, subject in refusals:
        client = clients[who]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.nc.jetstream().publish(subject, b"{}"), DENIED_WAIT_S)
        assert await _refused(client, subject), (who, subject, client.errors)
    agent = clients[MACHINE]
    intent = names.intent_subject("office", "w-forged")
    with contextlib.suppress(Exception):
        await asyncio.wait_for(agent.nc.jetstream().publish(intent, b"{}"), DENIED_WAIT_S)
    assert await _refused(agent, intent)
