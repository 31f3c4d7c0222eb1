"""The api's loops wait out Postgres being away as the transient failure it is (issue 35).

A database that restarts, fails over or is cut off refuses connections: the driver raises
`ConnectionRefusedError` unwrapped, which is no `SQLAlchemyError`. The timeline consumer took it
for a bug (a traceback for every event, each event tried in turn), and the outbox relay said
intents waited for NATS. Both now ask the shared list (`einsora.common.transient`).

Postgres is real; the cut is made by a TCP relay between the api and it, closed and reopened on
the same port, as a network partition or a database restart looks from the api.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.js.api import DeliverPolicy
from sqlalchemy.engine import make_url

from einsora.api.testing import RunningApi, eventually, running_api
from einsora.common.bus import names, publish
from einsora.common.bus.consumer import Reason
from einsora.common.schemas import EventKind, Placement, WorkloadEvent, WorkloadState, utcnow
from einsora.common.testing import Bus, until

from .conftest import settings_for

pytestmark = pytest.mark.postgres


class Relay:
    """Relays TCP connections on a loopback port to Postgres; `cut()` closes the port and
    breaks every connection through it, `restore()` opens the same port again."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.transport.abort()


@pytest_asyncio.fixture
async def relay(postgres_url: str) -> AsyncIterator[tuple[Relay, str]]:
    """A relay to the test's Postgres database, and the database's URL through it."""
    url = make_url(postgres_url)
    relay = Relay(url.host or "127.0.0.1", url.port or 5432)
    await relay.restore()
    try:
        yield relay, url.set(port=relay.port).render_as_string(hide_password=False)
    finally:
        await relay.cut()


@pytest_asyncio.fixture
async def api_via_relay(
    relay: tuple[Relay, str], bus: Bus, data_dir: Path
) -> AsyncIterator[RunningApi]:
    async with running_api(settings_for(bus.url, relay[1], data_dir)) as api:
        yield api


async def _launch(api: RunningApi) -> dict[str, Any]:
    answer = await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    assert answer.status == 201, answer.text
    body: dict[str, Any] = answer.body
    return body


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info]


async def test_the_timeline_waits_out_postgres_away_as_a_transient_failure(
    api_via_relay: RunningApi, relay: tuple[Relay, str], bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    api = api_via_relay
    workload = await _launch(api)
    timeline = api.service._timeline
    assert timeline is not None
    consumer = timeline._consumer
    caplog.set_level(logging.WARNING)
    await relay[0].cut()
    at = utcnow()
    placed = Placement(region="local", machine="m-away", placed_class="cpu-1c-2g")
    for seq, state in enumerate((WorkloadState.scheduled, WorkloadState.running), start=1):
        event = WorkloadEvent(
            event_id=f"{workload['id']}-{seq}",
            workload_id=workload["id"],
            tenant_id=workload["tenant_id"],
            kind=EventKind.transition,
            state=state,
            reason=f"seq {seq}",
            seq=seq,
            at=at,
            placement=placed if state is WorkloadState.scheduled else None,
        )
        await publish(
            bus.js,
            names.event_subject(workload["id"]),
            event,
            request_id="req-away",
            msg_id=event.event_id,
        )
    await until(
        lambda: (
            consumer.redelivered[Reason.retryable] >= 2
            or consumer.redelivered[Reason.unexpected] > 0
        ),
        what="the events retried",
    )
    assert consumer.redelivered[Reason.unexpected] == 0, "Postgres away taken for a bug"
    assert not [t for t in _tracebacks(caplog) if t.startswith("einsora.bus.consumer")]
    await relay[0].restore()

    async def running() -> bool:
        answer = await api.owner.get(f"/v1/workloads/{workload['id']}")
        return answer.status == 200 and answer.body["state"] == "running"

    await eventually(running, within_s=20, what="the events applied once Postgres is back")


async def test_the_outbox_relay_says_the_store_is_away_and_publishes_once_it_is_back(
    api_via_relay: RunningApi, relay: tuple[Relay, str], bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    api = api_via_relay
    outbox = api.service.relay
    assert outbox is not None
    caplog.set_level(logging.INFO, logger="einsora.api.consumers.outbox")
    await relay[0].cut()
    # Wake the relay now: its next read of the outbox meets the store away.
    assert api.service.store is not None
    api.service.store.outbox_written.set()
    await until(
        lambda: any(r.levelno >= logging.WARNING for r in caplog.records),
        what="the relay's failure said",
    )
    said = [r for r in caplog.records if r.name == "einsora.api.consumers.outbox"]
    assert [(r.levelno, r.getMessage()) for r in said] == [
        (logging.WARNING, "outbox unreadable; will retry")
    ]
    assert said[0].exc_info is None, "a transient failure is said without a traceback"
    await relay[0].restore()
    sub = await bus.js.subscribe(
        names.intent_region_filter("local"),
        stream=names.INTENTS.name,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
    )
    try:
        workload = await _launch(api)  # the relay publishes again
        msg = await sub.next_msg(timeout=15)
        assert workload["id"] in msg.subject
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    assert outbox._task is not None
    assert not outbox._task.done()
