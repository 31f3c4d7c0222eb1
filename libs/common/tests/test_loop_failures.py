"""Loops outlive every transient failure, from the one list, and say the others with their
traceback (issue 35): the shared rule (`einsora.common.failures`), and the durable consumer
taking a handler's transient failure for what it is, against a real nats-server."""

from __future__ import annotations

import logging
import secrets

import nats.errors
import nats.js.errors
import pytest
import sqlalchemy.exc
from nats.aio.msg import Msg

from einsora.common.bus import DurableConsumer, names, publish
from einsora.common.bus.consumer import Reason
from einsora.common.errors import BusUnavailable, ConfigError
from einsora.common.failures import log_failure, outlived, outlives
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState
from einsora.common.testing import Bus, until

RUN = secrets.token_hex(4)


def test_a_loop_outlives_every_transient_failure_and_only_the_others_it_names() -> None:
    assert outlives(nats.js.errors.NoStreamResponseError())
    assert outlives(nats.js.errors.APIError(code=400, err_code=10164))
    assert outlives(sqlalchemy.exc.OperationalError("x", {}, Exception("server closed")))
    assert outlives(ConnectionRefusedError())
    assert outlives(BusUnavailable("not connected"))
    refused = nats.js.errors.BadRequestError(code=400)
    assert not outlives(refused)
    assert outlives(refused, nats.errors.Error)
    assert not outlives(ValueError(), nats.errors.Error)
    assert not outlives(ConfigError("bad setting"), nats.errors.Error)
    with outlived():
        _raise(nats.errors.NoRespondersError())
    with pytest.raises(KeyError), outlived(nats.errors.Error):
        _raise(KeyError("a bug"))


def _raise(exc: Exception) -> None:
    raise exc


def test_a_transient_failure_is_said_without_its_traceback_and_another_with_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("einsora.test.loop")
    with caplog.at_level(logging.INFO, logger="einsora.test.loop"):
        log_failure(log, "step failed; retrying", nats.errors.NoRespondersError(), {"n": 1})
        log_failure(log, "step failed; retrying", nats.js.errors.BadRequestError(code=400))
    transient, other = caplog.records
    assert (transient.levelno, transient.exc_info) == (logging.WARNING, None)
    assert transient.__dict__["n"] == 1
    assert "NoRespondersError" in transient.__dict__["error"]
    assert other.levelno == logging.ERROR
    assert other.exc_info is not None


async def test_a_handlers_transient_bus_failure_naks_the_rest_of_its_fetch_as_retryable(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that asks the bus while nobody answers there (a real request, a real
    `NoRespondersError`) meets a transient failure, not a bug: it is retried without a
    traceback, and the rest of its fetch waits without a try of its own each (each would
    fail the same way, one slow try after another)."""
    subject = f"test.loop.{RUN}.answerer"
    calls: list[str] = []
    handled: list[str] = []

    async def handler(msg: Msg) -> None:
        name = WorkloadEvent.from_bytes(msg.data).event_id
        calls.append(name)
        await bus.nc.request(subject, b"?", timeout=2)
        handled.append(name)

    sent = [f"ev-t-{i}-{RUN}" for i in range(4)]
    for event_id in sent:
        event = WorkloadEvent(
            event_id=event_id,
            workload_id="w-1",
            tenant_id="t-1",
            kind=EventKind.note,
            state=WorkloadState.queued,
            reason="r",
            seq=0,
        )
        await publish(bus.js, names.event_subject("w-1"), event, request_id="r", msg_id=event_id)
    consumer = DurableConsumer(
        bus.js,
        stream=names.EVENTS.name,
        durable="transient-consumer",
        filter_subject=names.EVENTS_FILTER,
        handler=handler,
        retry_first_s=0.5,
    )
    caplog.set_level(logging.WARNING, logger="einsora.bus.consumer")
    await consumer.start()
    answerer = None
    try:
        await until(lambda: consumer.redelivered[Reason.retryable] >= len(sent), what="nak'ed")
        assert calls == [sent[0]]  # one try; the other three wait their turn without one
        assert consumer.redelivered[Reason.unexpected] == 0
        assert not [r for r in caplog.records if r.exc_info], "a transient failure is no bug"

        async def answer(msg: Msg) -> None:
            await msg.respond(b"!")

        answerer = await bus.nc.subscribe(subject, cb=answer)
        await until(lambda: len(handled) == len(sent), within_s=10, what="all handled")
    finally:
        await consumer.stop()
        if answerer is not None:
            await answerer.unsubscribe()
    assert sorted(handled) == sorted(sent)
