"""A joined agent comes back, whatever way nats-py ended its connection (issue 35, F3).

A real nats-server in Lab's accounts layout, with a real auth callout in the test whose
`authorize` plays the api's: it grants the machine's credential, or refuses it a set number of
times (the api's store away, say). The agent under test is the real one.

nats-py closes a connection whose reconnect was refused from a task of its own, and that close
can fail (writing what it still holds to the socket the server closed) before `closed_cb`
runs. The agent must notice the closed connection anyway, connect again with back-off, and
report. (An agent that starts while the api is down: tests/test_agent_comeback.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from einsora.agent.join import Enrolled
from einsora.agent.service import AgentService
from einsora.common.bus import bind_bucket, connect, identities, names, provision
from einsora.common.bus.accounts import APP_ACCOUNT, server_auth_conf
from einsora.common.bus.callout import AuthCallout, Grant
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import ObservedPhase
from einsora.common.settings import Settings
from einsora.common.testing import until
from einsora.testing.agent import ControlPlane

log = logging.getLogger("test.comeback")

MACHINE = "m-back"
CREDENTIAL = "agk_" + "c" * 40
UNREACHABLE_API = "http://127.0.0.1:9"
"""Nothing listens there: the agent cannot ask whether it was revoked."""
BACKOFF_MAX_S = 0.5
ROUNDS = 4
"""Refused reconnects in a row: each time the agent must come back."""
REFUSAL_S = 0.2
"""How long the api takes to refuse (a store lookup that failed). Meanwhile the server holds
the client's PING unread, so it resets the connection rather than closing it, and nats-py's
close of it fails: the failure this tests, made likely rather than left to chance."""


@dataclass
class Api:
    """The api's part in letting the machine in: its callout's `authorize`."""

    refuse: int = 0
    """How many more times the machine's credential is refused (its lookup failed)."""
    refused: int = 0

    async def authorize(self, token: str) -> Grant | None:
        if token != CREDENTIAL:
            return None
        if self.refuse > 0:
            self.refuse -= 1
            await asyncio.sleep(REFUSAL_S)
            self.refused += 1
            return None
        return Grant(MACHINE, identities.agent_permissions(MACHINE), 60.0)


@dataclass
class CalloutCell:
    """A server in the accounts layout, its callout, and the control plane's connections."""

    server: EmbeddedNats
    api: Api
    callout: AuthCallout
    system: NATS
    control: ControlPlane


@contextlib.asynccontextmanager
async def callout_cell(directory: Path) -> AsyncIterator[CalloutCell]:
    credentials = directory / "bus"
    ident = {
        name: identities.ensure_identity(credentials, name)
        for name in (identities.SCHEDULER, identities.CALLOUT, identities.SYSTEM)
    }
    issuer = identities.ensure_issuer(credentials)
    conf = server_auth_conf(
        {
            identities.SCHEDULER: (
                ident[identities.SCHEDULER],
                identities.service_permissions(identities.SCHEDULER),
            )
        },
        callout=ident[identities.CALLOUT],
        system=ident[identities.SYSTEM],
        issuer_public_key=issuer.public_key,
    )
    server = EmbeddedNats(directory / "nats", port=0, authorization=conf, app_account=APP_ACCOUNT)
    server.start()
    conns: list[NATS] = []

    async def static(name: str) -> NATS:
        nc = await connect(
            server.url,
            name=f"test-{name}",
            credentials=ident[name],
            inbox_prefix=identities.inbox_prefix(name),
        )
        conns.append(nc)
        return nc

    api = Api()
    callout = AuthCallout(issuer, api.authorize)
    try:
        scheduler = await static(identities.SCHEDULER)
        await provision(scheduler.jetstream())
        await callout.start(await static(identities.CALLOUT))
        yield CalloutCell(
            server=server,
            api=api,
            callout=callout,
            system=await static(identities.SYSTEM),
            control=ControlPlane(scheduler, bind_bucket(scheduler.jetstream(), names.MACHINES)),
        )
    finally:
        await callout.stop()
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.close()
        server.stop()


def enrolled_agent(cell: CalloutCell, data_dir: Path, *, heartbeat_s: float) -> AgentService:
    enrolment = Enrolled.model_validate(
        {
            "machine_id": MACHINE,
            "credential": CREDENTIAL,
            "owner_tenant_id": "t-owner",
            "region": "home",
            "sharing": "private",
            "api_url": UNREACHABLE_API,
            "nats_url": cell.server.url,
            "hostname": "box",
        }
    )
    return AgentService(
        Settings(data_dir=data_dir),
        enrolment=enrolment,
        driver="sim",
        heartbeat_s=heartbeat_s,
        resync_s=60.0,  # so only a live watch, or a new connection, delivers a change
        backoff_max_s=BACKOFF_MAX_S,
    )


async def test_an_agent_whose_reconnect_was_refused_once_comes_back(
    tmp_path: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with callout_cell(tmp_path) as cell:
        # A short heartbeat: the agent writes while it is cut off, so nats-py's close of the
        # refused connection has something still to send (that is where it failed).
        agent = enrolled_agent(cell, data_dir, heartbeat_s=0.05)
        await agent.start()
        try:
            control = cell.control
            await control.put_desired(MACHINE, 1, [control.workload("w-1")])
            await control.wait_workload(MACHINE, "w-1", lambda w: w.phase is ObservedPhase.running)

            # Cut off, and its next reconnect refused (the api's lookup failed once). Whether
            # nats-py's close of that connection then fails depends on what reaches the socket
            # first, so it is done a few times: each time the agent must come back.
            for generation in range(2, 2 + ROUNDS):
                await refused_once_then_back(cell, generation)
        finally:
            await agent.stop()
    assert agent.gone_reason is None


async def refused_once_then_back(cell: CalloutCell, generation: int) -> None:
    """Kick the agent with its next reconnect refused; it must come back, apply `generation`
    (written while it was away) and report."""
    control = cell.control
    cell.api.refuse = 1
    refused = cell.api.refused
    cut = time.monotonic()
    assert await cell.callout.kick(MACHINE, cell.system) == 1
    await until(lambda: cell.api.refused > refused, within_s=10, what="a refused reconnect")
    workloads = [control.workload(f"w-{g}") for g in range(1, generation + 1)]
    await control.put_desired(MACHINE, generation, workloads)
    # Back within its back-off: connected anew, it reads what was written meanwhile.
    state = await control.wait_observed(
        MACHINE, lambda s: s.generation_applied == generation, within_s=5
    )
    log.info("back and converged %.3f s after the kick", time.monotonic() - cut)
    assert len(state.workloads) == generation
    # …and its machine reports: heartbeats go on over the new connection.
    first = state.heartbeat_at
    await control.wait_observed(MACHINE, lambda s: s.heartbeat_at > first, within_s=5)
