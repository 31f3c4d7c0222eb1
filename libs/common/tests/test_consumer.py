"""The durable consumer's ack policy, against a real nats-server."""

import asyncio
import secrets
from collections.abc import Sequence

from nats.aio.msg import Msg

from einsora.common.bus import DurableConsumer, names, publish
from einsora.common.errors import EinsoraError
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState
from einsora.common.testing import Bus

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
        backoff=(0.05,),
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
