"""The durable consumer's ack policy, against a real nats-server."""

import asyncio
import logging
import secrets
from collections.abc import Sequence

import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from einsora.common.bus import DurableConsumer, names, publish
from einsora.common.bus.consumer import (
    RETRY_CAP_S,
    RETRY_FIRST_S,
    RETRY_JITTER,
    UNLIMITED_DELIVERIES,
    Reason,
    retry_delay,
)
from einsora.common.errors import EinsoraError
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState
from einsora.common.testing import Bus, until

# The session's server remembers message ids for its duplicate window across tests, so every
# test uses ids of its own.
RUN = secrets.token_hex(4)


def _event(event_id: str) -> WorkloadEvent:
    return WorkloadEvent(
        event_id=f"{event_id}-{RUN}",
        workload_id="w-1",
        tenant_id="t-1",
        kind=EventKind.note,
        state=WorkloadState.queued,
        reason="r",
        seq=0,
    )


async def _send(bus: Bus, name: str) -> None:
    event = _event(name)
    await publish(bus.js, names.event_subject("w-1"), event, request_id="r", msg_id=event.event_id)


async def _wait(condition: asyncio.Event, within_s: float = 5) -> None:
    await asyncio.wait_for(condition.wait(), within_s)


async def test_transient_failure_is_retried_and_poison_is_terminated(bus: Bus) -> None:
    handled: list[str] = []
    attempts: dict[str, int] = {}
    done = asyncio.Event()

    async def handler(msg: Msg) -> None:
        event = WorkloadEvent.from_bytes(msg.data)
        name = event.event_id.removesuffix(f"-{RUN}")
        attempts[name] = attempts.get(name, 0) + 1
        if name == "ev-poison":
            raise EinsoraError("cannot ever handle this", retryable=False)
        if name == "ev-flaky" and attempts["ev-flaky"] == 1:
            raise EinsoraError("store busy", retryable=True)
        handled.append(name)
        if name == "ev-last":
            done.set()

    consumer = DurableConsumer(
        bus.js,
        stream=names.EVENTS.name,
        durable="test-consumer",
        filter_subject=names.EVENTS_FILTER,
        handler=handler,
        retry_first_s=0.05,
    )
    await consumer.start()
    for event_id in ("ev-poison", "ev-flaky", "ev-ok"):
        await publish(
            bus.js,
            names.event_subject("w-1"),
            _event(event_id),
            request_id="r",
            msg_id=f"{event_id}-{RUN}",
        )
    while "ev-flaky" not in handled:
        await publish(
            bus.js,
            names.event_subject("w-1"),
            _event("ev-last"),
            request_id="r",
            msg_id=f"ev-last-{RUN}",
        )
        await _wait(done)
    await consumer.stop()

    assert attempts["ev-poison"] == 1
    assert attempts["ev-flaky"] == 2
    assert set(handled) == {"ev-flaky", "ev-ok", "ev-last"}
    info = await bus.js.consumer_info(names.EVENTS.name, "test-consumer")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0


async def test_a_restarted_consumer_resumes_where_it_stopped(bus: Bus) -> None:
    seen: list[str] = []
    got = asyncio.Event()

    async def handler(msg: Msg) -> None:
        seen.append(WorkloadEvent.from_bytes(msg.data).event_id.removesuffix(f"-{RUN}"))
        got.set()

    def make() -> DurableConsumer:
        return DurableConsumer(
            bus.js,
            stream=names.EVENTS.name,
            durable="resume",
            filter_subject=names.EVENTS_FILTER,
            handler=handler,
        )

    first = make()
    await first.start()
    await _send(bus, "ev-1")
    await _wait(got)
    await first.stop()
    got.clear()
    await _send(bus, "ev-2")
    second = make()
    await second.start()
    await _wait(got)
    await second.stop()
    assert seen == ["ev-1", "ev-2"]


async def test_a_batch_handler_takes_fetched_batches_and_falls_back_one_by_one(bus: Bus) -> None:
    batches: list[list[str]] = []
    singles: list[str] = []
    done = asyncio.Event()

    def name_of(msg: Msg) -> str:
        return WorkloadEvent.from_bytes(msg.data).event_id.removesuffix(f"-{RUN}")

    async def batch_handler(msgs: Sequence[Msg]) -> None:
        names_in = [name_of(m) for m in msgs]
        batches.append(names_in)
        if "ev-b-poison" in names_in:
            raise EinsoraError("one of these is poison", retryable=False)
        if "ev-b-last" in names_in:
            done.set()

    async def handler(msg: Msg) -> None:
        name = name_of(msg)
        singles.append(name)
        if name == "ev-b-poison":
            raise EinsoraError("cannot ever handle this", retryable=False)
        if name == "ev-b-last":
            done.set()

    for event_id in ("ev-b-1", "ev-b-2", "ev-b-poison", "ev-b-3"):
        await _send(bus, event_id)
    consumer = DurableConsumer(
        bus.js,
        stream=names.EVENTS.name,
        durable="batch-consumer",
        filter_subject=names.EVENTS_FILTER,
        handler=handler,
        batch_handler=batch_handler,
    )
    await consumer.start()
    await _send(bus, "ev-b-last")
    await _wait(done)
    await consumer.stop()

    assert batches[0][:4] == ["ev-b-1", "ev-b-2", "ev-b-poison", "ev-b-3"]
    assert singles[:4] == ["ev-b-1", "ev-b-2", "ev-b-poison", "ev-b-3"]
    info = await bus.js.consumer_info(names.EVENTS.name, "batch-consumer")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0


async def test_a_store_outage_naks_the_rest_of_a_fetch_without_trying_each(bus: Bus) -> None:
    # Each try during an outage can take seconds (a store that does not answer, an engine that
    # backs off): trying every fetched message in turn held the others back for minutes.
    calls: list[str] = []
    handled: list[str] = []
    store = {"up": False}

    async def handler(msg: Msg) -> None:
        name = WorkloadEvent.from_bytes(msg.data).event_id.removesuffix(f"-{RUN}")
        calls.append(name)
        if not store["up"]:
            raise EinsoraError("store unavailable", retryable=True)
        handled.append(name)

    sent = [f"ev-o-{i}" for i in range(5)]
    for event_id in sent:
        await _send(bus, event_id)
    consumer = DurableConsumer(
        bus.js,
        stream=names.EVENTS.name,
        durable="outage-consumer",
        filter_subject=names.EVENTS_FILTER,
        handler=handler,
        retry_first_s=0.5,
    )
    await consumer.start()
    try:
        await until(lambda: consumer.redelivered[Reason.retryable] >= len(sent), what="nak'ed")
        assert calls == ["ev-o-0"]  # one try; the other four wait their turn without one
        store["up"] = True
        await until(lambda: len(handled) == len(sent), within_s=10, what="all handled")
    finally:
        await consumer.stop()
    assert sorted(handled) == sent  # each once, none lost
    info = await bus.js.consumer_info(names.EVENTS.name, "outage-consumer")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0


def _low(lo: float, hi: float) -> float:
    return lo


def _high(lo: float, hi: float) -> float:
    return hi


def test_retry_delays_double_from_the_first_to_the_cap_with_jitter_around_them() -> None:
    bases = [min(RETRY_CAP_S, RETRY_FIRST_S * 2 ** (n - 1)) for n in range(1, 12)]
    assert [retry_delay(n, jitter=0) for n in range(1, 12)] == pytest.approx(bases)
    assert retry_delay(1, jitter=0) == pytest.approx(0.2)
    assert retry_delay(9, jitter=0) == pytest.approx(30.0)
    # A message retried for days still waits the cap, not an overflow or zero.
    assert retry_delay(10**6, jitter=0) == pytest.approx(RETRY_CAP_S)
    assert retry_delay(10**6, uniform=_high) == pytest.approx(RETRY_CAP_S * (1 + RETRY_JITTER))
    assert retry_delay(10**6, uniform=_low) == pytest.approx(RETRY_CAP_S * (1 - RETRY_JITTER))
    assert retry_delay(1, uniform=_low) == pytest.approx(0.16)
    assert retry_delay(1, uniform=_high) == pytest.approx(0.24)


def _retries(caplog: pytest.LogCaptureFixture, durable: str) -> list[tuple[int, float]]:
    return [
        (r.__dict__["deliveries"], r.__dict__["delay_s"])
        for r in caplog.records
        if r.getMessage() == "message will be retried" and r.__dict__.get("consumer") == durable
    ]


def _terminations(caplog: pytest.LogCaptureFixture, durable: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage().startswith("message terminated") and r.__dict__.get("consumer") == durable
    ]


async def test_a_retryable_failure_is_retried_past_any_cap_and_handled_once(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="einsora.bus.consumer")
    failures = 35  # the old consumer gave up after 20 deliveries
    deliveries: list[int] = []
    handled: list[str] = []
    done = asyncio.Event()

    async def handler(msg: Msg) -> None:
        deliveries.append(msg.metadata.num_delivered)
        if len(deliveries) <= failures:
            raise EinsoraError("store unavailable", retryable=True)
        handled.append(WorkloadEvent.from_bytes(msg.data).event_id)
        done.set()

    first_s, cap_s, jitter = 0.005, 0.04, 0.2
    consumer = DurableConsumer(
        bus.js,
        stream=names.EVENTS.name,
        durable="retry-forever",
        filter_subject=names.EVENTS_FILTER,
        handler=handler,
        batch=1,
        retry_first_s=first_s,
        retry_cap_s=cap_s,
        retry_jitter=jitter,
    )
    await consumer.start()
    await _send(bus, "ev-outage")
    await _wait(done, within_s=60)
    await consumer.stop()

    assert handled == [f"ev-outage-{RUN}"]
    assert deliveries == list(range(1, failures + 2))
    assert consumer.redelivered == {"retryable": failures}
    assert not consumer.terminated
    info = await bus.js.consumer_info(names.EVENTS.name, "retry-forever")
    assert info.config.max_deliver == UNLIMITED_DELIVERIES
    assert info.num_ack_pending == 0
    assert info.num_pending == 0

    retries = _retries(caplog, "retry-forever")
    assert [n for n, _ in retries] == list(range(1, failures + 1))
    for n, delay in retries:
        base = min(cap_s, first_s * 2 ** (n - 1))
        assert base * (1 - jitter) <= delay <= base * (1 + jitter), (n, delay)
    # It grew from the first delay to the cap (0.005 doubled 3 times) and stayed there.
    assert retries[0][1] <= first_s * (1 + jitter)
    assert all(cap_s * (1 - jitter) <= d <= cap_s * (1 + jitter) for n, d in retries if n >= 4)


async def test_a_non_retryable_error_terminates_at_once_logged_and_counted(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: dict[str, int] = {}
    seqs: dict[str, int] = {}
    done = asyncio.Event()

    async def handler(msg: Msg) -> None:
        name = WorkloadEvent.from_bytes(msg.data).event_id.removesuffix(f"-{RUN}")
        attempts[name] = attempts.get(name, 0) + 1
        seqs[name] = msg.metadata.sequence.stream
        if name == "ev-refused":
            raise EinsoraError("event for 'w-2' came on the wrong subject", code="bad_event")
        done.set()

    consumer = DurableConsumer(
        bus.js,
        stream=names.EVENTS.name,
        durable="poison",
        filter_subject=names.EVENTS_FILTER,
        handler=handler,
        batch=1,
    )
    await consumer.start()
    await _send(bus, "ev-refused")
    await _send(bus, "ev-after")  # handled in order: the poison was dealt with before it
    await _wait(done)
    await consumer.stop()

    assert attempts == {"ev-refused": 1, "ev-after": 1}
    assert consumer.terminated == {"non_retryable": 1}
    assert not consumer.redelivered
    [line] = _terminations(caplog, "poison")
    assert line.levelno == logging.ERROR
    text = line.getMessage()
    assert names.event_subject("w-1") in text
    assert f"seq {seqs['ev-refused']} " in text
    assert "bad_event" in text
    assert "came on the wrong subject" in text
    assert line.__dict__["stream_seq"] == seqs["ev-refused"]
    info = await bus.js.consumer_info(names.EVENTS.name, "poison")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0
    assert info.num_redelivered == 0


async def test_an_unparseable_message_is_terminated_without_logging_its_content(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    seen: list[int] = []
    done = asyncio.Event()

    async def handler(msg: Msg) -> None:
        seen.append(msg.metadata.num_delivered)
        if msg.data == b"ok":
            done.set()
            return
        WorkloadEvent.from_bytes(msg.data)

    consumer = DurableConsumer(
        bus.js,
        stream=names.EVENTS.name,
        durable="unparseable",
        filter_subject=names.EVENTS_FILTER,
        handler=handler,
        batch=1,
        registry=registry,
    )
    await consumer.start()
    await bus.js.publish(names.event_subject("w-1"), b'{"event_id": 7, "reason": "sekret-token"}')
    await bus.js.publish(names.event_subject("w-1"), b"ok")
    await _wait(done)
    await consumer.stop()

    assert seen == [1, 1]
    assert consumer.terminated == {"unparseable": 1}
    [line] = _terminations(caplog, "unparseable")
    assert "event_id" in line.getMessage()
    assert "sekret-token" not in line.getMessage()
    labels = {"consumer": "unparseable", "reason": "unparseable"}
    assert registry.get_sample_value("einsora_bus_messages_terminated_total", labels) == 1.0


async def test_an_existing_durable_with_a_delivery_cap_is_updated_when_the_consumer_starts(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="einsora.bus.consumer")
    # What the old code declared: max_deliver=20, so a message failing 20 times was dropped.
    await bus.js.add_consumer(
        names.EVENTS.name,
        ConsumerConfig(
            durable_name="legacy",
            filter_subject=names.EVENTS_FILTER,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_deliver=20,
            ack_wait=30.0,
            max_ack_pending=1000,
        ),
    )
    await _send(bus, "ev-waiting")
    seen: list[str] = []
    got = asyncio.Event()

    async def handler(msg: Msg) -> None:
        seen.append(WorkloadEvent.from_bytes(msg.data).event_id.removesuffix(f"-{RUN}"))
        got.set()

    def make() -> DurableConsumer:
        return DurableConsumer(
            bus.js,
            stream=names.EVENTS.name,
            durable="legacy",
            filter_subject=names.EVENTS_FILTER,
            handler=handler,
        )

    first = make()
    await first.start()
    await _wait(got)
    await first.stop()
    info = await bus.js.consumer_info(names.EVENTS.name, "legacy")
    assert info.config.max_deliver == UNLIMITED_DELIVERIES
    assert seen == ["ev-waiting"]  # updated in place: what it had pending is still delivered

    second = make()  # declaring it again changes nothing
    await second.start()
    await second.stop()
    updates = [r for r in caplog.records if r.getMessage() == "consumer updated"]
    assert [(r.__dict__["consumer"], r.__dict__["fields"]) for r in updates] == [
        ("legacy", ["max_deliver"])
    ]
