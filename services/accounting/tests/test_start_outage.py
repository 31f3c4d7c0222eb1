"""Accounting started while JetStream is unavailable comes up once it is back (issue 35, F5).

Accounting restarted just before a NATS node was lost met `nats: timeout` in its first
JetStream call (provisioning) and exited for good: usage answered 503 and running workloads
went unmetered. Here a real nats-server runs without JetStream on the port accounting dials (its
JetStream API has no responders: what a cluster without a meta leader answers too), then is
replaced by one with JetStream on the same port. Accounting must wait, say so once, and come up
on its own, consuming workload events.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from einsora.accounting.service import EVENTS_CONSUMER, AccountingService
from einsora.common.bus import close_quietly, connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats, nats_server_binary, port_is_free
from einsora.common.settings import Settings
from einsora.common.testing import until

RETRYING = "start-up step failed; retrying with back-off"


class PlainNats:
    """A real nats-server without JetStream on a given port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._proc = subprocess.Popen(
            [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while port_is_free("127.0.0.1", port):
            assert self._proc.poll() is None, "nats-server exited at start"
            assert time.monotonic() < deadline, "nats-server did not listen within 10 s"
            time.sleep(0.01)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(10)


class JetStreamAway:
    """`own_nats_server`'s port served by a server without JetStream, until `back()`."""

    def __init__(self, server: EmbeddedNats) -> None:
        self.server = server
        server.stop()
        self.plain = PlainNats(server.port)

    def back(self) -> None:
        """JetStream is back: the server with it, on the same port."""
        self.plain.stop()
        self.server.start()


@pytest.fixture
def jetstream_away(own_nats_server: EmbeddedNats) -> Iterator[JetStreamAway]:
    away = JetStreamAway(own_nats_server)
    try:
        yield away
    finally:
        away.plain.stop()


def retried(caplog: pytest.LogCaptureFixture, step: str) -> bool:
    return any(
        r.getMessage() == RETRYING and getattr(r, "step", None) == step for r in caplog.records
    )


async def test_accounting_started_while_jetstream_is_unavailable_comes_up_when_it_is_back(
    jetstream_away: JetStreamAway,
    data_dir: Path,
    sqlite_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    url = jetstream_away.server.url
    settings = Settings(nats_url=url, database_url=sqlite_url, data_dir=data_dir)
    accounting = AccountingService(settings, publish_debounce_s=0.05)
    starting = asyncio.create_task(accounting.start())
    nc = None
    try:
        await until(
            lambda: starting.done() or retried(caplog, "provisioning the usage bucket"),
            within_s=20,
            what="accounting waiting for JetStream",
        )
        assert not starting.done(), starting.exception()  # it did not exit

        jetstream_away.back()
        nc = await connect(url, name="test-api")
        await provision(nc.jetstream())  # the api's streams, as the api makes them
        await asyncio.wait_for(starting, 30)

        info = await nc.jetstream().consumer_info(names.EVENTS.name, EVENTS_CONSUMER)
        assert info.name == EVENTS_CONSUMER  # it consumes workload events
        said = [r.getMessage() for r in caplog.records if r.name == "einsora.startup"]
        assert said.count(RETRYING) == 1  # once for the outage, however many tries it took
        assert "start-up step done after retries" in said
    finally:
        if not starting.done():
            starting.cancel()
        await accounting.stop()
        await close_quietly(nc)
