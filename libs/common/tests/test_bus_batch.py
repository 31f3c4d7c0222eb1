"""Runs of messages published as atomic batches, against a real nats-server."""

import secrets

from nats.js.api import PubAck, StreamConfig
from prometheus_client import CollectorRegistry

from einsora.common.bus import names
from einsora.common.bus.batch import MAX_BATCH, MIN_BATCH, BatchPublisher, Message
from einsora.common.testing import Bus


def _events(n: int, prefix: str | None = None) -> list[Message]:
    prefix = prefix or secrets.token_hex(4)
    return [
        (names.event_subject(f"w-{i % 7}"), f"event {i}".encode(), {"Nats-Msg-Id": f"{prefix}-{i}"})
        for i in range(n)
    ]


async def _stored(bus: Bus, stream: str) -> list[tuple[bytes, dict[str, str]]]:
    info = await bus.js.stream_info(stream)
    stored = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.js.get_msg(stream, seq)
        stored.append((msg.data or b"", msg.headers or {}))
    return stored


async def test_a_run_is_stored_in_order_as_one_batch(bus: Bus) -> None:
    publisher = BatchPublisher(bus.nc, bus.js, stream=names.EVENTS.name)
    run = _events(40)

    acks = await publisher.publish(run)

    assert all(isinstance(a, PubAck) for a in acks)
    seqs = [a.seq for a in acks if isinstance(a, PubAck)]
    assert seqs == list(range(seqs[0], seqs[0] + 40))
    stored = await _stored(bus, names.EVENTS.name)
    assert [data for data, _ in stored] == [payload for _, payload, _ in run]
    assert len({h[names.BATCH_ID_HEADER] for _, h in stored}) == 1
    assert stored[-1][1][names.BATCH_COMMIT_HEADER] == "1"
    assert (publisher.batches, publisher.batched) == (1, 40)


async def test_a_run_holding_a_stored_message_is_stored_once_each(bus: Bus) -> None:
    """A republished run (after a crash, or an ack that came too late) is refused as a batch;
    sent one by one, its stored messages are dropped as duplicates and the rest stored."""
    publisher = BatchPublisher(bus.nc, bus.js, stream=names.EVENTS.name)
    run = _events(30)
    await publisher.publish(run[10:11])

    acks = await publisher.publish(run)

    assert all(isinstance(a, PubAck) for a in acks)
    assert [bool(a.duplicate) for a in acks if isinstance(a, PubAck)] == [
        i == 10 for i in range(30)
    ]
    stored = await _stored(bus, names.EVENTS.name)
    assert sorted(data for data, _ in stored) == sorted(payload for _, payload, _ in run)
    assert publisher.batches == 0

    again = await publisher.publish(run)  # everything already stored: nothing new

    assert all(isinstance(a, PubAck) and a.duplicate for a in again)
    assert len(await _stored(bus, names.EVENTS.name)) == 30


async def test_a_short_run_goes_out_message_by_message(bus: Bus) -> None:
    publisher = BatchPublisher(bus.nc, bus.js, stream=names.INTENTS.name)
    run = [
        (names.intent_subject("local", f"w-{i}"), b"{}", {"Nats-Msg-Id": secrets.token_hex(8)})
        for i in range(MIN_BATCH - 1)
    ]

    acks = await publisher.publish(run)

    assert all(isinstance(a, PubAck) and not a.duplicate for a in acks)
    stored = await _stored(bus, names.INTENTS.name)
    assert len(stored) == MIN_BATCH - 1
    assert not any(names.BATCH_ID_HEADER in h for _, h in stored)


async def test_a_run_longer_than_a_batch_is_split(bus: Bus) -> None:
    publisher = BatchPublisher(bus.nc, bus.js, stream=names.EVENTS.name)
    run = _events(MAX_BATCH + MIN_BATCH)

    acks = await publisher.publish(run)

    assert all(isinstance(a, PubAck) for a in acks)
    assert (publisher.batches, publisher.batched) == (2, MAX_BATCH + MIN_BATCH)
    info = await bus.js.stream_info(names.EVENTS.name)
    assert info.state.messages == MAX_BATCH + MIN_BATCH


async def test_a_stream_without_atomic_batches_is_published_one_by_one(bus: Bus) -> None:
    stream = f"PLAIN_{secrets.token_hex(3).upper()}"
    await bus.js.add_stream(StreamConfig(name=stream, subjects=[f"plain.{stream}.>"]))
    try:
        publisher = BatchPublisher(bus.nc, bus.js, stream=stream)
        run = [(f"plain.{stream}.x", b"m", {"Nats-Msg-Id": f"p-{i}"}) for i in range(20)]

        first = await publisher.publish(run[:MIN_BATCH])
        rest = await publisher.publish(run[MIN_BATCH:] + run[:2])

        assert all(isinstance(a, PubAck) for a in first + rest)
        info = await bus.js.stream_info(stream)
        assert info.state.messages == 20
        assert publisher.batches == 0
        assert not publisher._atomic_allowed()  # no second refused batch for every run
    finally:
        await bus.js.delete_stream(stream)


async def test_without_a_connection_every_message_is_reported_unsent(bus: Bus) -> None:
    publisher = BatchPublisher(bus.nc, bus.js, stream=names.EVENTS.name, timeout_s=1.0)
    await bus.nc.close()

    outcomes = await publisher.publish(_events(20))

    assert len(outcomes) == 20
    assert all(isinstance(o, BaseException) for o in outcomes)


async def test_batches_and_refusals_are_counted_for_prometheus(bus: Bus) -> None:
    registry = CollectorRegistry()
    publisher = BatchPublisher(bus.nc, bus.js, stream=names.EVENTS.name, registry=registry)
    labels = {"stream": names.EVENTS.name}

    def count(name: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert count("einsora_bus_atomic_batches_total") == 0  # every series there from the start
    run = _events(20)
    await publisher.publish(run)
    await publisher.publish(run)  # all stored already: refused, then one by one

    assert count("einsora_bus_atomic_batches_total") == 1
    assert count("einsora_bus_messages_batched_total") == 20
    assert count("einsora_bus_atomic_batches_refused_total") == 1


async def test_intents_and_events_take_atomic_batches(bus: Bus) -> None:
    for stream in (names.INTENTS, names.EVENTS):
        info = await bus.js.stream_info(stream.name)
        assert info.config.allow_atomic is True
