"""Agents from other machines are confined to their own keys under the auth callout (issue 14).

A real nats-server runs in the accounts layout (`accounts.server_auth_conf`) with an AuthCallout
in the test whose `authorize` maps each machine's credential to `agent_permissions(machine)`, as
the api's will. The buckets and streams are provisioned by the product's own `provision`, so the
hardening tested is the product's. An agent uses the agent's real KV binding and pinned watch
(`MachineAgent`). Each refusal is the server's own: a permissions violation it reports to the
client, or a JetStream error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nkeys
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError
from nats.js.kv import KeyValue

from einsora.agent.drivers.registry import DriverSet
from einsora.agent.drivers.sim import SimDriver
from einsora.agent.machine import MachineAgent
from einsora.agent.supervisor import Timing
from einsora.common.bus import bind_bucket, identities, names, provision, watch_key
from einsora.common.bus.accounts import APP_ACCOUNT, server_auth_conf
from einsora.common.bus.callout import AuthCallout, Grant, encode_jwt, verify_jwt
from einsora.common.bus.identities import Identity
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import DesiredState, Inventory
from einsora.common.testing import self_signed_certificate

log = logging.getLogger("test.bus_callout")

M1, M2 = "m1", "m2"
SCHEDULER_DURABLE = "scheduler-local"
DENIED_TIMEOUT_S = 0.4
"""The JetStream timeout of an agent's denied calls; the refusal itself arrives sooner."""
DEADLINE_S = 3.0
"""How long a test waits for the server's answer or refusal (a deadline, not an expected time)."""
BROKEN_TOKEN = "agk_" + "x" * 20
"""A credential whose lookup raises (the store is down): refused, and never logged."""


@dataclass
class Client:
    """A raw client that records the server's errors (nats-py lower-cases them)."""

    nc: NATS
    errors: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    def saw(self, *words: str) -> bool:
        return any(all(w.lower() in e.lower() for w in words) for e in self.errors)

    async def wait_for_error(self, *words: str, within_s: float = DEADLINE_S) -> None:
        try:
            async with asyncio.timeout(within_s):
                while not self.saw(*words):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"no error with {words} within {within_s} s: {self.errors}"
            ) from None

    async def refused(self, subject: str, attempt: Awaitable[object] | None = None) -> None:
        """The server refuses this client on `subject` (while `attempt`, if any, runs)."""
        task = None if attempt is None else asyncio.ensure_future(attempt)
        try:
            await self.wait_for_error("permissions violation", f'"{subject}"')
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


@dataclass
class Lab:
    """A server in the accounts layout with its callout, and the control plane's connections."""

    server: EmbeddedNats
    callout: AuthCallout
    callout_nc: NATS
    grants: dict[str, Grant]
    tokens: dict[str, str]
    system: NATS
    scheduler: NATS
    tls: ssl.SSLContext | None
    requests: list[str] = field(default_factory=list)

    async def client(self, token: str | None, inbox_identity: str, **extra: Any) -> Client:
        """A connection with `token` (None: no credential), which does not reconnect."""
        client = Client(nc=NATS())

        async def on_error(exc: Exception) -> None:
            client.errors.append(str(exc))
            client.changed.set()

        async def on_closed() -> None:
            # nats-py reports why the server closed it (an expiry, say) only here.
            client.errors.append(f"closed: {client.nc.last_error}")
            client.closed.set()

        options: dict[str, Any] = {
            "inbox_prefix": identities.inbox_prefix(inbox_identity),
            "error_cb": on_error,
            "closed_cb": on_closed,
            "allow_reconnect": False,
            "max_reconnect_attempts": 0,
            "connect_timeout": 3,
            **extra,
        }
        if token is not None:
            options["token"] = token
        if self.tls is not None:
            options.setdefault("tls", self.tls)
        await _connect(client.nc, self.server.url, **options)
        return client

    async def agent(self, machine: str) -> Agent:
        client = await self.client(self.tokens[machine], machine)
        return Agent(client, machine)


@dataclass
class Agent:
    """A connected agent: its raw client and the agent's own binding of `machines`."""

    client: Client
    machine: str

    @property
    def nc(self) -> NATS:
        return self.client.nc

    @property
    def js(self) -> JetStreamContext:
        """For denied calls: a short timeout backs up the server's refusal."""
        return self.nc.jetstream(timeout=DENIED_TIMEOUT_S)

    @property
    def kv(self) -> KeyValue:
        """The agent's own binding (`bind_bucket`), with the default timeout."""
        return bind_bucket(self.nc.jetstream(), names.MACHINES)


async def _connect(nc: NATS, url: str, **options: Any) -> None:
    try:
        await nc.connect(url, **options)
    except BaseException:
        # nats-py leaves a refused connection's socket open (a ResourceWarning later), and
        # closing one whose TLS handshake failed waits for ever.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(nc.close(), 0.5)
        raise


def _grant(machine: str, expires_s: float = 60.0) -> Grant:
    return Grant(machine, identities.agent_permissions(machine), expires_s)


@contextlib.asynccontextmanager
async def running_lab(
    directory: Path, tls_files: tuple[Path, Path] | None = None, ca: ssl.SSLContext | None = None
) -> AsyncIterator[Lab]:
    """A server as Lab runs it: services static, agents through the callout."""
    credentials = directory / "bus"
    ident = {
        name: identities.ensure_identity(credentials, name)
        for name in (identities.SCHEDULER, identities.API, identities.CALLOUT, identities.SYSTEM)
    }
    issuer = identities.ensure_issuer(credentials)
    users = {
        name: (ident[name], identities.service_permissions(name))
        for name in (identities.SCHEDULER, identities.API)
    }
    conf = server_auth_conf(
        users,
        callout=ident[identities.CALLOUT],
        system=ident[identities.SYSTEM],
        issuer_public_key=issuer.public_key,
    )
    server = EmbeddedNats(
        directory / "nats", port=0, authorization=conf, app_account=APP_ACCOUNT, tls=tls_files
    )
    server.start()
    tokens = {m: f"agk_{m}{secrets.token_urlsafe(24)}" for m in (M1, M2)}
    grants = {tokens[m]: _grant(m) for m in (M1, M2)}
    asked: list[str] = []

    async def authorize(token: str) -> Grant | None:
        asked.append(token)
        if token == BROKEN_TOKEN:
            raise RuntimeError(f"store unreachable while looking up {token}")
        return grants.get(token)

    conns: list[NATS] = []

    async def static(identity: Identity) -> NATS:
        nc = await nats.connect(
            server.url,
            nkeys_seed_str=identity.seed,
            inbox_prefix=identities.inbox_prefix(identity.name),
            tls=ca,
        )
        conns.append(nc)
        return nc

    callout = AuthCallout(issuer, authorize)
    try:
        callout_nc = await static(ident[identities.CALLOUT])
        await callout.start(callout_nc)
        lab = Lab(
            server=server,
            callout=callout,
            callout_nc=callout_nc,
            grants=grants,
            tokens=tokens,
            system=await static(ident[identities.SYSTEM]),
            scheduler=await static(ident[identities.SCHEDULER]),
            tls=ca,
            requests=asked,
        )
        yield lab
    finally:
        await callout.stop()
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.close()
        server.stop()


@pytest_asyncio.fixture(scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Lab]:
    async with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        js = lab.scheduler.jetstream()
        await provision(js)
        machines = bind_bucket(js, names.MACHINES)
        for m in (M1, M2):
            desired = DesiredState(machine_id=m, generation=1, workloads=[])
            await machines.put(names.desired_key(m), desired.to_bytes())
        await bind_bucket(js, names.ROUTES).put(names.route_key("w-1"), b'{"token": "secret"}')
        # The scheduler's own durable consumer, which an agent must not take over.
        await js.add_consumer(
            names.INTENTS.name,
            ConsumerConfig(
                durable_name=SCHEDULER_DURABLE,
                filter_subject=names.intent_region_filter("local"),
                ack_policy=AckPolicy.EXPLICIT,
            ),
        )
        yield lab


@pytest_asyncio.fixture
async def m1(lab: Lab) -> AsyncIterator[Agent]:
    agent = await lab.agent(M1)
    try:
        yield agent
    finally:
        await agent.nc.close()


def _inventory(machine: str) -> Inventory:
    return Inventory(
        machine_id=machine, region="local", hostname="h", os="linux", arch="x86_64", cpus=1,
        memory_mib=1024, drivers=["sim"],
    )  # fmt: skip


def _machine_agent(agent: Agent, changed: asyncio.Event) -> MachineAgent:
    """The agent's real per-machine code on this connection."""
    return MachineAgent(
        agent.machine,
        js=agent.nc.jetstream(),
        kv=agent.kv,
        drivers=DriverSet([SimDriver()], "sim"),
        inventory=_inventory(agent.machine),
        workloads_dir=None,
        records=None,
        timing=Timing(),
        on_change=lambda _: changed.set(),
    )


# --- allowed ----------------------------------------------------------------------------------


async def test_a1_an_agent_reads_its_own_desired_state(m1: Agent) -> None:
    entry = await m1.kv.get(names.desired_key(M1))
    assert entry.value is not None
    assert DesiredState.from_bytes(entry.value).machine_id == M1
    assert not m1.client.errors


async def test_a2_an_agents_pinned_watch_gets_its_desired_state_and_each_change(
    lab: Lab, m1: Agent
) -> None:
    changed = asyncio.Event()
    agent = _machine_agent(m1, changed)
    try:
        await agent.open()  # inventory, the pinned watch, then the consistent first read
        async with asyncio.timeout(DEADLINE_S):
            while agent.applied != 1:
                changed.clear()
                await changed.wait()
        update = DesiredState(machine_id=M1, generation=2, workloads=[])
        await bind_bucket(lab.scheduler.jetstream(), names.MACHINES).put(
            names.desired_key(M1), update.to_bytes()
        )
        async with asyncio.timeout(DEADLINE_S):
            while agent.applied != 2:
                changed.clear()
                await changed.wait()
    finally:
        await agent.close()
    assert not m1.client.errors


@pytest.mark.parametrize("kind", ["observed", "inventory"])
async def test_a3_an_agent_writes_its_own_observed_state_and_inventory(
    lab: Lab, m1: Agent, kind: str
) -> None:
    agent = _machine_agent(m1, asyncio.Event())
    await (agent.put_observed() if kind == "observed" else agent.put_inventory())
    key = names.observed_key(M1) if kind == "observed" else names.inventory_key(M1)
    entry = await bind_bucket(lab.scheduler.jetstream(), names.MACHINES).get(key)
    assert entry.value is not None
    assert json.loads(entry.value)["machine_id"] == M1
    assert not m1.client.errors


# --- refused: one attempt each ------------------------------------------------------------------


def _key(machine: str, kind: str) -> str:
    return names.MACHINES.key_subject(f"{machine}.{kind}")


def _request(
    subject: str, body: dict[str, Any] | None = None
) -> Callable[[Agent], Awaitable[object]]:
    return lambda a: a.nc.request(subject, json.dumps(body or {}).encode(), DENIED_TIMEOUT_S)


def _get(bucket: names.BucketName, key: str) -> Callable[[Agent], Awaitable[object]]:
    return lambda a: bind_bucket(a.js, bucket).get(key)


def _subscribe(subject: str) -> Callable[[Agent], Awaitable[object]]:
    return lambda a: a.nc.subscribe(subject)


def _publish(subject: str, data: bytes = b"{}") -> Callable[[Agent], Awaitable[object]]:
    return lambda a: a.nc.publish(subject, data)


_DIRECT = f"$JS.API.DIRECT.GET.{names.MACHINES.stream}"
_CREATE = f"$JS.API.CONSUMER.CREATE.{names.MACHINES.stream}"
REFUSED: list[tuple[str, str, Callable[[Agent], Awaitable[object]]]] = [
    # (id, the subject the server refuses, the attempt)
    ("get-other-desired", f"{_DIRECT}.{_key(M2, 'desired')}", _get(names.MACHINES, "m2.desired")),
    (
        "watch-other-desired",
        f"{_CREATE}.m2_desired.{_key(M2, 'desired')}",
        lambda a: watch_key(a.js, names.MACHINES, "m2.desired", "m2_desired"),
    ),
    (
        "watch-every-machine",
        f"{_CREATE}.m1_desired.$KV.machines.>",
        lambda a: watch_key(a.js, names.MACHINES, ">", "m1_desired"),
    ),
    ("stock-kv-watch", _CREATE, lambda a: a.kv.watch("m1.desired")),
    ("put-other-observed", _key(M2, "observed"), _publish(_key(M2, "observed"))),
    ("put-other-desired", _key(M2, "desired"), _publish(_key(M2, "desired"))),
    ("put-own-desired", _key(M1, "desired"), _publish(_key(M1, "desired"))),
    ("kv-keys", _CREATE, lambda a: a.kv.keys()),
    (
        "js-key-value",
        f"$JS.API.STREAM.INFO.{names.MACHINES.stream}",
        lambda a: a.js.key_value(names.MACHINES.name),
    ),
    (
        "stream-info-lists-keys",
        f"$JS.API.STREAM.INFO.{names.MACHINES.stream}",
        _request(f"$JS.API.STREAM.INFO.{names.MACHINES.stream}", {"subjects_filter": ">"}),
    ),
    (
        "bare-consumer-create-with-body-filter",
        _CREATE,
        _request(
            _CREATE,
            {
                "stream_name": names.MACHINES.stream,
                "config": {"filter_subject": "$KV.machines.>", "deliver_subject": "_INBOX_m1.x"},
            },
        ),
    ),
    (
        "stream-msg-get",
        f"$JS.API.STREAM.MSG.GET.{names.MACHINES.stream}",
        _request(
            f"$JS.API.STREAM.MSG.GET.{names.MACHINES.stream}", {"last_by_subj": _key(M2, "desired")}
        ),
    ),
    ("bare-direct-get", _DIRECT, _request(_DIRECT, {"last_by_subj": _key(M2, "desired")})),
    (
        "purge-bucket",
        f"$JS.API.STREAM.PURGE.{names.MACHINES.stream}",
        lambda a: a.js.purge_stream(names.MACHINES.stream),
    ),
    (
        "delete-bucket",
        f"$JS.API.STREAM.DELETE.{names.MACHINES.stream}",
        lambda a: a.js.delete_stream(names.MACHINES.stream),
    ),
    (
        "delete-other-key",
        f"$JS.API.STREAM.MSG.DELETE.{names.MACHINES.stream}",
        lambda a: a.js.delete_msg(names.MACHINES.stream, 1),
    ),
    ("subscribe-every-machine", "$KV.machines.>", _subscribe("$KV.machines.>")),
    ("subscribe-other-desired", _key(M2, "desired"), _subscribe(_key(M2, "desired"))),
    ("subscribe-every-inbox", "_INBOX.>", _subscribe("_INBOX.>")),
    ("subscribe-everything", ">", _subscribe(">")),
    (
        "publish-an-intent",
        names.intent_subject("local", "w-1"),
        _publish(names.intent_subject("local", "w-1")),
    ),
    ("publish-an-event", names.event_subject("w-1"), _publish(names.event_subject("w-1"))),
    (
        "write-a-route",
        names.ROUTES.key_subject("w-1"),
        _publish(names.ROUTES.key_subject("w-1")),
    ),
    (
        "read-a-route",
        f"$JS.API.DIRECT.GET.{names.ROUTES.stream}.{names.ROUTES.key_subject('w-1')}",
        _get(names.ROUTES, "w-1"),
    ),
    (
        "read-a-gateway-key",
        f"$JS.API.DIRECT.GET.{names.GATEWAY_KEYS.stream}.{names.GATEWAY_KEYS.key_subject('k-1')}",
        _get(names.GATEWAY_KEYS, "k-1"),
    ),
    (
        "read-its-enrolment",
        f"$JS.API.DIRECT.GET.{names.ENROLMENTS.stream}.{names.ENROLMENTS.key_subject(M1)}",
        _get(names.ENROLMENTS, M1),
    ),
    (
        "request-access-redeem",
        names.ACCESS_REDEEM_SUBJECT,
        _request(names.ACCESS_REDEEM_SUBJECT),
    ),
    (
        "answer-access-redeem",
        names.ACCESS_REDEEM_SUBJECT,
        _subscribe(names.ACCESS_REDEEM_SUBJECT),
    ),
    (
        "hijack-the-schedulers-consumer",
        f"$JS.API.CONSUMER.CREATE.{names.INTENTS.name}.{SCHEDULER_DURABLE}.intent.local.workload.w-1",
        _request(
            f"$JS.API.CONSUMER.CREATE.{names.INTENTS.name}.{SCHEDULER_DURABLE}"
            ".intent.local.workload.w-1",
            {
                "stream_name": names.INTENTS.name,
                "config": {
                    "name": SCHEDULER_DURABLE,
                    "durable_name": SCHEDULER_DURABLE,
                    "filter_subject": "intent.local.workload.w-1",
                },
            },
        ),
    ),
    (
        "hijack-a-name-on-its-own-key",
        f"{_CREATE}.{SCHEDULER_DURABLE}.{_key(M1, 'desired')}",
        _request(f"{_CREATE}.{SCHEDULER_DURABLE}.{_key(M1, 'desired')}"),
    ),
    ("ask-the-servers", "$SYS.REQ.SERVER.PING", _request("$SYS.REQ.SERVER.PING")),
]


@pytest.mark.parametrize(
    ("subject", "attempt"), [(s, a) for _, s, a in REFUSED], ids=[i for i, _, _ in REFUSED]
)
async def test_refused(
    lab: Lab, m1: Agent, subject: str, attempt: Callable[[Agent], Awaitable[object]]
) -> None:
    await m1.client.refused(subject, attempt(m1))


async def test_refused_a_rollup_on_its_own_key(lab: Lab, m1: Agent) -> None:
    """Subject permissions cannot see headers: the hardened bucket refuses the rollup itself."""
    with pytest.raises(APIError, match="rollup not permitted"):
        await m1.nc.jetstream().publish(_key(M1, "observed"), b"{}", headers={"Nats-Rollup": "all"})
    other = await bind_bucket(lab.scheduler.jetstream(), names.MACHINES).get("m2.desired")
    assert other.value is not None
    assert DesiredState.from_bytes(other.value).machine_id == M2


async def test_refused_another_agents_replies(lab: Lab, m1: Agent) -> None:
    m2 = await lab.agent(M2)
    try:
        seen: list[Msg] = []

        async def spy(msg: Msg) -> None:
            seen.append(msg)

        await m1.nc.subscribe(f"{identities.inbox_prefix(M2)}.>", cb=spy)
        await m1.client.refused(f"{identities.inbox_prefix(M2)}.>")
        secret = await m2.kv.get(names.desired_key(M2))  # its reply goes to _INBOX_m2
        assert secret.value is not None
        await m1.kv.get(names.desired_key(M1))  # a round trip after it, on m1's connection
        assert seen == []
    finally:
        await m2.nc.close()


async def test_the_schedulers_consumer_is_unchanged_after_the_hijacks(lab: Lab) -> None:
    info = await lab.scheduler.jetstream().consumer_info(names.INTENTS.name, SCHEDULER_DURABLE)
    assert info.config.filter_subject == names.intent_region_filter("local")


# --- who may connect ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "credential", ["unknown", "revoked", "broken-store", "none"], ids=lambda c: str(c)
)
async def test_a_credential_the_control_plane_does_not_grant_is_refused_at_connect(
    lab: Lab, credential: str, caplog: pytest.LogCaptureFixture
) -> None:
    token = {
        "unknown": "agk_" + secrets.token_urlsafe(24),
        "revoked": "agk_" + secrets.token_urlsafe(24),
        "broken-store": BROKEN_TOKEN,
        "none": None,
    }[credential]
    if credential == "revoked":  # it worked until the control plane revoked it
        assert token is not None
        lab.grants[token] = _grant(M1)
        await (await lab.client(token, M1)).nc.close()
        del lab.grants[token]
    with caplog.at_level(logging.INFO), pytest.raises(nats.errors.Error, match="Authorization"):
        await lab.client(token, M1)
    if token is not None:
        assert token in lab.requests  # the callout asked, and said no
        assert all(token not in r.getMessage() + str(r.__dict__) for r in caplog.records)


async def test_static_services_connect_without_the_callout(lab: Lab) -> None:
    """The control plane's own identities are `auth_users`: the callout is never asked, so
    they connect and work while it is down (agents then wait for the server's callout timeout
    and are refused; connections already made keep working)."""
    m1 = await lab.agent(M1)
    await lab.callout.stop()
    try:
        asked = len(lab.requests)
        credentials = lab.server.data_dir.parent / "bus"
        api = await nats.connect(
            lab.server.url,
            nkeys_seed_str=identities.load_identity(credentials, identities.API).seed,
            inbox_prefix=identities.inbox_prefix(identities.API),
        )
        info = await api.jetstream().stream_info(names.EVENTS.name)
        assert info.config.name == names.EVENTS.name
        assert await bind_bucket(lab.scheduler.jetstream(), names.MACHINES).get("m1.desired")
        assert (await m1.kv.get(names.desired_key(M1))).value is not None
        started = time.perf_counter()
        with pytest.raises(nats.errors.Error):
            await lab.client(lab.tokens[M1], M1)
        log.info(
            "agent refused while the callout is down, after %.0f ms",
            (time.perf_counter() - started) * 1000,
        )
        assert len(lab.requests) == asked
        await api.close()
    finally:
        await lab.callout.start(lab.callout_nc)
        await m1.nc.close()


async def test_a_grant_carries_replies_and_denials_as_its_permissions_say(lab: Lab) -> None:
    """The JWT's `resp` and `pub.deny` mirror Permissions (a service granted by the callout)."""
    tokens = {"svc": "agk_" + secrets.token_urlsafe(24), "cli": "agk_" + secrets.token_urlsafe(24)}
    lab.grants[tokens["svc"]] = Grant(
        "svc",
        identities.Permissions(
            publish=("none",), subscribe=("svc.echo", "_INBOX_svc.>"), allow_responses=True
        ),
        30,
    )
    lab.grants[tokens["cli"]] = Grant(
        "cli",
        identities.Permissions(
            publish=("svc.>",), subscribe=("_INBOX_cli.>",), publish_deny=("svc.secret",)
        ),
        30,
    )
    svc, cli = await lab.client(tokens["svc"], "svc"), await lab.client(tokens["cli"], "cli")
    try:

        async def echo(msg: Msg) -> None:
            await msg.respond(b"echo " + msg.data)

        await svc.nc.subscribe("svc.echo", cb=echo)
        # A round trip after the SUB (nats-py's flush is no barrier for it): no one answers.
        with pytest.raises(nats.errors.NoRespondersError):
            await svc.nc.request("none", b"", DEADLINE_S)
        assert (await cli.nc.request("svc.echo", b"hi", DEADLINE_S)).data == b"echo hi"
        await cli.refused("svc.secret", cli.nc.publish("svc.secret", b"x"))
        await svc.refused("elsewhere", svc.nc.publish("elsewhere", b"x"))
    finally:
        await svc.nc.close()
        await cli.nc.close()


# --- revocation and expiry ------------------------------------------------------------------


async def test_a_kick_closes_the_agents_connection_and_its_reconnect_is_refused(lab: Lab) -> None:
    machine = "m-kicked"
    token = "agk_" + secrets.token_urlsafe(24)
    lab.grants[token] = _grant(machine)
    agent = await lab.client(token, machine)
    second = await lab.client(token, machine)  # a machine may hold two connections
    await bind_bucket(agent.nc.jetstream(), names.MACHINES).put(names.observed_key(machine), b"{}")
    del lab.grants[token]  # revoked in the store first, then kicked
    started = time.perf_counter()
    kicked = await lab.callout.kick(machine, lab.system)
    async with asyncio.timeout(5):
        await agent.closed.wait()
        await second.closed.wait()
    log.info(
        "kick closed the agent's connections %.2f ms after the kick began; it saw %s",
        (time.perf_counter() - started) * 1000,
        agent.errors,
    )
    assert kicked == 2
    with pytest.raises(nats.errors.Error, match="Authorization"):
        await lab.client(token, machine)
    assert await lab.callout.kick(machine, lab.system) == 0  # forgotten


async def test_at_expiry_the_server_ends_the_session_and_a_new_connect_gets_a_new_jwt(
    lab: Lab,
) -> None:
    token = "agk_" + secrets.token_urlsafe(24)
    lab.grants[token] = _grant(M1, expires_s=2.0)
    # Reconnects allowed, as the product's connect() does: nats-py still gives up.
    agent = await lab.client(
        token, M1, allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=0.1
    )
    started = time.perf_counter()
    async with asyncio.timeout(10):
        await agent.closed.wait()
    log.info(
        "the session ended %.2f s after connect (JWT exp is whole seconds); it saw %s",
        time.perf_counter() - started,
        agent.errors,
    )
    # nats-py treats it as fatal: it closes and does not reconnect (the agent's own loop must).
    assert agent.saw("expired"), agent.errors
    again = await lab.client(token, M1)
    assert (await bind_bucket(again.nc.jetstream(), names.MACHINES).get("m1.desired")).value
    await again.nc.close()


# --- TLS ------------------------------------------------------------------------------------


async def test_over_tls_an_agent_connects_and_a_plain_client_is_refused(tmp_path: Path) -> None:
    files = self_signed_certificate(tmp_path)
    trusting = ssl.create_default_context(cafile=str(files[0]))
    async with running_lab(tmp_path / "tls-lab", files, trusting) as lab:
        assert lab.server.url.startswith("tls://")
        await provision(lab.scheduler.jetstream())
        agent = await lab.agent(M1)
        assert agent.nc.connected_url is not None
        await agent.kv.put(names.observed_key(M1), b"{}")
        await agent.nc.close()
        # A client speaking plain NATS (its credential in clear) gets no session: the server
        # wants a TLS handshake first and drops the connection.
        reader, writer = await asyncio.open_connection(lab.server.host, lab.server.port)
        try:
            info = json.loads((await reader.readline()).removeprefix(b"INFO "))
            assert info["tls_required"] is True
            connect = {"auth_token": lab.tokens[M1], "verbose": False, "protocol": 1}
            writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            await writer.drain()
            async with asyncio.timeout(DEADLINE_S):
                answer = await reader.read()  # until the server closes
            assert b"PONG" not in answer
        finally:
            writer.close()
        # A client that does not trust the certificate refuses the server.
        with pytest.raises(ssl.SSLCertVerificationError):
            await _connect(
                NATS(), lab.server.url, token=lab.tokens[M1], allow_reconnect=False,
                connect_timeout=2, error_cb=_quiet,
            )  # fmt: skip


async def _quiet(exc: Exception) -> None:
    log.info("expected connect error: %s", exc)


# --- measurement ----------------------------------------------------------------------------


# --- the JWT helpers ------------------------------------------------------------------------


def test_a_jwt_verifies_only_as_signed(tmp_path: Path) -> None:
    signer = nkeys.from_seed(identities.ensure_issuer(tmp_path).seed.encode())
    token = encode_jwt({"iss": signer.public_key.decode(), "sub": "U1", "n": 1}, signer)
    assert verify_jwt(token)["n"] == 1
    header, claims, sig = token.split(".")
    forged = base64.urlsafe_b64encode(
        json.dumps({"iss": signer.public_key.decode(), "sub": "U1", "n": 2}).encode()
    )
    for bad in (
        f"{header}.{forged.decode().rstrip('=')}.{sig}",  # changed claims
        f"{header}.{claims}.{sig[:-4]}AAAA",  # changed signature
        f"{header}.{claims}",  # no signature
        "not a jwt",
    ):
        with pytest.raises(ValueError, match="JWT"):
            verify_jwt(bad)
