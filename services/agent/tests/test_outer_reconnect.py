"""The agent survives what nats-py does not: a connection the server ends over its credential.

nats-py closes for good when the server ends a session over its credential (an expired or
revoked user gets `-ERR`; a removed nkey user is dropped, and its reconnects refused for ever).
A real nats-server whose config is reloaded (`kill -HUP`) without the agent's user, then with it
again, does exactly that here, with no auth callout needed. The agent must come back, watch
again, and apply a desired state written while it was away and one written after.

A refused credential is then told apart by asking the api (`GET /v1/machines/self`). That route
is served here by a tiny aiohttp app on a real socket, answering as the contract says: it stands
in for the api's one route, which is being written at the same time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from nats.aio.client import Client as NATS

from einsora.agent.join import Enrolled, MachineRevoked, save_enrolment
from einsora.agent.service import AgentService
from einsora.common.bus import bind_bucket, connect, identities, names, provision
from einsora.common.bus.identities import Identity, Permissions
from einsora.common.embedded_nats import nats_server_binary
from einsora.common.schemas import ObservedPhase
from einsora.common.settings import Settings
from einsora.common.testing import subprocess_env, until
from einsora.testing.agent import ControlPlane

log = logging.getLogger("test.outer_reconnect")

MACHINE = "m-outer"
CREDENTIAL = "agk_" + "a" * 40
OTHER_CREDENTIAL = "agk_" + "b" * 40
RETRYING = "cannot connect to NATS; retrying with back-off"


class ReloadableNats:
    """A real nats-server whose `authorization` block a test rewrites and reloads (SIGHUP)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.config = directory / "nats.conf"
        self.log = directory / "nats.log"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"nats://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def _write(self, authorization: str) -> None:
        partial = self.config.with_suffix(".partial")
        partial.write_text(
            f'listen: "127.0.0.1:{self.port}"\nlog_file: "{self.log}"\n'
            f'jetstream {{ store_dir: "{self.directory / "js"}" }}\n{authorization}\n'
        )
        os.replace(partial, self.config)  # the server never reads half a file

    def _logged(self, text: str) -> int:
        return self.log.read_text().count(text) if self.log.exists() else 0

    def start(self, authorization: str) -> None:
        self._write(authorization)
        self._proc = subprocess.Popen([str(nats_server_binary()), "-c", str(self.config)])
        deadline = time.monotonic() + 10
        while not self._logged("Server is ready"):
            assert self._proc.poll() is None, "nats-server exited at start"
            assert time.monotonic() < deadline, "nats-server did not start within 10 s"
            time.sleep(0.01)

    async def reload(self, authorization: str) -> None:
        """Rewrite the config and reload it; returns once the server says it reloaded."""
        assert self._proc is not None
        before = self._logged("Reloaded server configuration")
        self._write(authorization)
        self._proc.send_signal(signal.SIGHUP)
        await until(
            lambda: self._logged("Reloaded server configuration") > before,
            within_s=10,
            what="nats-server reloaded its config",
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)


@pytest.fixture
def reloadable_nats(tmp_path: Path) -> Iterator[ReloadableNats]:
    server = ReloadableNats(tmp_path)
    yield server
    server.stop()


def token_auth(token: str) -> str:
    return f'authorization {{ token: "{token}" }}'


async def control_plane(
    url: str, *, credentials: Identity | None = None, token: str | None = None
) -> tuple[NATS, ControlPlane]:
    nc = await connect(url, name="test-scheduler", credentials=credentials, token=token)
    js = nc.jetstream()
    await provision(js)
    return nc, ControlPlane(nc, bind_bucket(js, names.MACHINES))


def retrying(caplog: pytest.LogCaptureFixture) -> bool:
    return any(r.getMessage() == RETRYING for r in caplog.records)


# --- shut out by a reload, then let in again ------------------------------------------------


@dataclass
class NkeyUsers:
    """The admin (the test's scheduler) and the agent, each an nkey user of its own."""

    admin: Identity
    credentials_dir: Path

    def authorization(self, *, with_agent: bool) -> str:
        users: dict[str, tuple[Identity, Permissions]] = {
            "admin": (self.admin, Permissions(publish=(">",), subscribe=(">",)))
        }
        if with_agent:
            agent = identities.ensure_identity(self.credentials_dir, MACHINE)
            users[MACHINE] = (agent, identities.agent_permissions(MACHINE))
        return identities.authorization_conf(users)


async def test_the_agent_comes_back_after_the_server_shut_it_out(
    reloadable_nats: ReloadableNats,
    tmp_path: Path,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    creds = tmp_path / "bus"
    users = NkeyUsers(identities.ensure_identity(creds, "admin"), creds)
    reloadable_nats.start(users.authorization(with_agent=True))
    admin, control = await control_plane(reloadable_nats.url, credentials=users.admin)
    agent = AgentService(
        Settings(nats_url=reloadable_nats.url, data_dir=data_dir, nats_credentials_dir=creds),
        machine_id=MACHINE,
        driver="sim",
        heartbeat_s=0.5,
        resync_s=60.0,  # so only the watch can deliver a change within the test's waits
        backoff_max_s=0.5,
    )
    await agent.start()
    try:
        await control.put_desired(MACHINE, 1, [control.workload("w-a")])
        await control.wait_workload(MACHINE, "w-a", lambda w: w.phase is ObservedPhase.running)

        # Shut out: its live connection is dropped, and every reconnect refused.
        await reloadable_nats.reload(users.authorization(with_agent=False))
        await until(lambda: retrying(caplog), what="the agent retrying after being refused")
        await control.put_desired(MACHINE, 2, [control.workload("w-a"), control.workload("w-b")])
        away = await control.observed(MACHINE)
        assert away is not None
        assert away.generation_applied == 1

        # Let in again: it connects anew, reads what was written while it was away, converges.
        let_in = time.monotonic()
        await reloadable_nats.reload(users.authorization(with_agent=True))
        await control.wait_observed(
            MACHINE,
            lambda s: (
                s.generation_applied == 2
                and {w.workload_id: w.phase for w in s.workloads}
                == {"w-a": ObservedPhase.running, "w-b": ObservedPhase.running}
            ),
        )
        log.info("back and converged %.3f s after the reload", time.monotonic() - let_in)

        # The watch is back too: a change after the return arrives without a resync.
        changed = time.monotonic()
        await control.put_desired(MACHINE, 3, [control.workload("w-b")])
        await control.wait_observed(MACHINE, lambda s: s.generation_applied == 3, within_s=5)
        log.info("a change after the return applied in %.3f s", time.monotonic() - changed)
        inventory = await control.inventory(MACHINE)
        assert inventory is not None
    finally:
        await agent.stop()
        await admin.close()
    assert agent.gone_reason is None


# --- a refused machine credential: ask the api ----------------------------------------------


@dataclass
class SelfRoute:
    """The api's `GET /v1/machines/self`: what it answers, and the credentials it was sent."""

    url: str = ""
    answer: str = "revoked"
    """revoked (401 machine_revoked), unavailable (503) or enrolled (200, not revoked)."""
    asked: list[str | None] = field(default_factory=list)

    async def route(self, request: web.Request) -> web.Response:
        self.asked.append(request.headers.get("authorization"))
        if self.answer == "revoked":
            # The api's error body (services/api/src/einsora/api/errors.py).
            body = {"error": "machine_revoked", "message": f"machine {MACHINE} was revoked"}
            return web.json_response({**body, "request_id": "req-1", "details": []}, status=401)
        if self.answer == "unavailable":
            return web.json_response({"error": "unavailable", "message": "store"}, status=503)
        return web.json_response(
            {
                "machine_id": MACHINE,
                "revoked": False,
                "region": "home",
                "owner_tenant_id": "t-owner",
                "sharing": "private",
            }
        )


@pytest_asyncio.fixture
async def api() -> AsyncIterator[SelfRoute]:
    route = SelfRoute()
    app = web.Application()
    app.router.add_get("/v1/machines/self", route.route)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    route.url = str(server.make_url("")).rstrip("/")
    try:
        yield route
    finally:
        await server.close()


def enrolment_for(server: ReloadableNats, api: SelfRoute, credential: str = CREDENTIAL) -> Enrolled:
    return Enrolled.model_validate(
        {
            "machine_id": MACHINE,
            "credential": credential,
            "owner_tenant_id": "t-owner",
            "region": "home",
            "sharing": "private",
            "api_url": api.url,
            "nats_url": server.url,
            "hostname": "box",
        }
    )


async def enrolled_agent(server: ReloadableNats, api: SelfRoute, data_dir: Path) -> AgentService:
    """An enrolled machine's agent: its id, NATS URL and token all come from the enrolment."""
    return AgentService(
        Settings(data_dir=data_dir),
        enrolment=enrolment_for(server, api),
        driver="sim",
        heartbeat_s=0.5,
        resync_s=60.0,
        backoff_max_s=0.5,
    )


async def test_a_revoked_machine_stops_for_good_and_says_so(
    reloadable_nats: ReloadableNats,
    api: SelfRoute,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reloadable_nats.start(token_auth(CREDENTIAL))
    admin, control = await control_plane(reloadable_nats.url, token=CREDENTIAL)
    agent = await enrolled_agent(reloadable_nats, api, data_dir)
    await agent.start()
    try:
        await control.put_desired(MACHINE, 1, [control.workload("w-a")])
        await control.wait_workload(MACHINE, "w-a", lambda w: w.phase is ObservedPhase.running)
        inventory = await control.inventory(MACHINE)
        assert inventory is not None
        assert inventory.region == "home"  # the enrolment's, not the settings' default

        # The server now refuses the credential (-ERR, then refused reconnects: the fatal close
        # nats-py also makes on an expired session), and the api says the machine was revoked.
        revoked_at = time.monotonic()
        await reloadable_nats.reload(token_auth(OTHER_CREDENTIAL))
        reason = await asyncio.wait_for(agent.wait_gone(), 20)
        log.info("stopped %.3f s after the revocation", time.monotonic() - revoked_at)
    finally:
        await agent.stop()
        await admin.close()
    assert isinstance(reason, MachineRevoked)
    assert reason.message.startswith("machine revoked: the agent stops")
    assert api.asked[-1] == f"Bearer {CREDENTIAL}"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["machine revoked: the agent stops"]
    assert agent.running_count() == 0  # its workloads stopped: no agent can adopt them now
    logged = "\n".join(repr(r.__dict__) for r in caplog.records)
    assert CREDENTIAL not in logged


async def test_a_revoked_machine_does_not_start(
    reloadable_nats: ReloadableNats, api: SelfRoute, data_dir: Path
) -> None:
    reloadable_nats.start(token_auth(OTHER_CREDENTIAL))
    agent = await enrolled_agent(reloadable_nats, api, data_dir)
    with pytest.raises(MachineRevoked, match="machine revoked: the agent stops"):
        await agent.start()


async def test_a_refused_credential_that_is_not_revoked_is_tried_again(
    reloadable_nats: ReloadableNats,
    api: SelfRoute,
    data_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An api that cannot tell (503), or says the machine is enrolled (the callout was down,
    say): the agent keeps trying, and comes back when NATS lets it in again."""
    api.answer = "unavailable"
    reloadable_nats.start(token_auth(CREDENTIAL))
    admin, control = await control_plane(reloadable_nats.url, token=CREDENTIAL)
    agent = await enrolled_agent(reloadable_nats, api, data_dir)
    await agent.start()
    try:
        await control.put_desired(MACHINE, 1, [control.workload("w-a")])
        await control.wait_workload(MACHINE, "w-a", lambda w: w.phase is ObservedPhase.running)
        await admin.close()

        await reloadable_nats.reload(token_auth(OTHER_CREDENTIAL))
        await until(lambda: len(api.asked) >= 1, what="the agent asking the api")
        api.answer = "enrolled"
        asked = len(api.asked)
        await until(lambda: len(api.asked) > asked, what="the agent asking the api again")
        admin, control = await control_plane(reloadable_nats.url, token=OTHER_CREDENTIAL)
        await control.put_desired(MACHINE, 2, [control.workload("w-a"), control.workload("w-b")])
        await admin.close()

        await reloadable_nats.reload(token_auth(CREDENTIAL))
        admin, control = await control_plane(reloadable_nats.url, token=CREDENTIAL)
        await control.wait_workload(MACHINE, "w-b", lambda w: w.phase is ObservedPhase.running)
        await control.put_desired(MACHINE, 3, [control.workload("w-b")])
        await control.wait_observed(MACHINE, lambda s: s.generation_applied == 3, within_s=5)
    finally:
        await agent.stop()
        await admin.close()
    assert agent.gone_reason is None
    # One warning for the whole outage, however many attempts it took.
    assert [r.getMessage() for r in caplog.records].count(RETRYING) == 1


@pytest.mark.slow
async def test_einsora_agent_exits_non_zero_when_its_machine_is_revoked(
    reloadable_nats: ReloadableNats, api: SelfRoute, data_dir: Path
) -> None:
    reloadable_nats.start(token_auth(CREDENTIAL))
    admin, control = await control_plane(reloadable_nats.url, token=CREDENTIAL)
    save_enrolment(data_dir, enrolment_for(reloadable_nats, api))
    env = subprocess_env(EINSORA_DATA_DIR=str(data_dir), EINSORA_LOG_FORMAT="text")
    for name in ("EINSORA_NATS_URL", "EINSORA_NATS_CREDENTIALS_DIR", "EINSORA_REGION"):
        env.pop(name, None)
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "einsora.agent", "--driver", "sim", "--heartbeat", "0.5"),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await control.wait_observed(MACHINE, lambda s: s.generation_applied == 0, within_s=60)
        await admin.close()
        await reloadable_nats.reload(token_auth(OTHER_CREDENTIAL))
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 1
    assert "einsora: machine revoked: the agent stops" in err.decode()


async def test_an_expired_session_is_renewed_without_losing_the_watch(
    tmp_path: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the real auth callout with 2 s sessions: nats-py closes for good at each expiry;
    the agent authenticates again and every desired state written meanwhile is applied."""
    from einsora.common.bus.accounts import server_auth_conf
    from einsora.common.bus.callout import AuthCallout, Grant

    caplog.set_level(logging.INFO)
    creds = tmp_path / "bus"
    admin = identities.ensure_identity(creds, "admin")
    callout = identities.ensure_identity(creds, identities.CALLOUT)
    issuer = identities.ensure_issuer(creds)
    conf = server_auth_conf(
        {"admin": (admin, Permissions(publish=(">",), subscribe=(">",)))},
        callout=callout,
        system=identities.ensure_identity(creds, identities.SYSTEM),
        issuer_public_key=issuer.public_key,
    )
    server = ReloadableNats(tmp_path)
    server.start(conf)
    responder: AuthCallout | None = None
    clients: list[NATS] = []
    agent: AgentService | None = None
    try:

        async def authorize(token: str) -> Grant | None:
            if token != CREDENTIAL:
                return None
            return Grant(MACHINE, identities.agent_permissions(MACHINE), 2.0)

        responder = AuthCallout(issuer, authorize)
        clients.append(await connect(server.url, name="callout", credentials=callout))
        await responder.start(clients[0])
        clients.append(await connect(server.url, name="admin", credentials=admin))
        await provision(clients[1].jetstream())
        control = ControlPlane(clients[1], bind_bucket(clients[1].jetstream(), names.MACHINES))
        enrolled = Enrolled.model_validate(
            {
                "machine_id": MACHINE,
                "credential": CREDENTIAL,
                "owner_tenant_id": "t-test",
                "region": "home",
                "sharing": "private",
                "api_url": "http://127.0.0.1:9",
                "nats_url": server.url,
                "hostname": "h",
            }
        )
        agent = AgentService(
            Settings(data_dir=data_dir),
            enrolment=enrolled,
            driver="sim",
            heartbeat_s=0.3,
            resync_s=60,  # only the watch can deliver the changes below
            backoff_max_s=0.5,
        )
        await agent.start()
        await control.put_desired(MACHINE, 1, [control.workload("w-a")])
        await control.wait_workload(MACHINE, "w-a", lambda w: w.phase is ObservedPhase.running)

        def expiries() -> int:
            return sum(r.getMessage().startswith("NATS closed the agent") for r in caplog.records)

        await until(lambda: expiries() >= 1, within_s=10, what="a first expiry")
        await control.put_desired(MACHINE, 2, [control.workload("w-a"), control.workload("w-b")])
        await control.wait_observed(MACHINE, lambda s: s.generation_applied == 2, within_s=5)
        await until(lambda: expiries() >= 3, within_s=10, what="two more expiries")
        await control.put_desired(MACHINE, 3, [control.workload("w-b")])
        state = await control.wait_observed(
            MACHINE, lambda s: s.generation_applied == 3, within_s=5
        )
        assert [w.workload_id for w in state.workloads if w.phase is ObservedPhase.running] == [
            "w-b"
        ]
        assert agent.gone_reason is None  # expiry is routine, never a reason to stop
    finally:
        if agent is not None:
            await agent.stop()
        if responder is not None:
            await responder.stop()
        for nc in clients:
            await nc.close()
        server.stop()
