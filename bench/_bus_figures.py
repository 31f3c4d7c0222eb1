"""What the bus itself allows, measured in a benchmark's own run: the durable-write ceiling, what
an atomic batch's commit costs against it, the messages stored meanwhile (and how many of them
came in atomic batches), and whether the consumers have digested everything."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig

from einsora.common.bus import names
from einsora.common.bus.batch import BatchPublisher, Message

CEILING_PUBLISHES = 5000


async def durable_write_ceiling(js: JetStreamContext) -> float:
    """Pipelined publishes per second that nats-server stores and acks (each one fsynced)."""
    stream = "BENCH_CEILING"
    await js.add_stream(StreamConfig(name=stream, subjects=["bench.ceiling"]))
    try:
        payload = b"x" * 300  # about an intent's size
        t0 = time.perf_counter()
        futures = [
            await js.publish_async("bench.ceiling", payload) for _ in range(CEILING_PUBLISHES)
        ]
        await asyncio.gather(*futures)
        return CEILING_PUBLISHES / (time.perf_counter() - t0)
    finally:
        await js.delete_stream(stream)


@dataclass(frozen=True)
class BatchCost:
    """Seconds of the bus's durable-write time an atomic batch of n messages takes:
    fixed_s + n * per_message_s (measured alone, one batch after another)."""

    fixed_s: float
    per_message_s: float

    def writes(self, n: int, ceiling_per_s: float) -> float:
        """An n-message batch, in lone fsynced publishes (the ceiling's unit)."""
        return (self.fixed_s + n * self.per_message_s) * ceiling_per_s


async def batch_cost(nc: NATS, js: JetStreamContext) -> BatchCost:
    """Time sequential atomic batches of two sizes and fit a line through them."""
    stream = "BENCH_BATCHES"
    await js.add_stream(StreamConfig(name=stream, subjects=["bench.batches"], allow_atomic=True))
    try:
        publisher = BatchPublisher(nc, js, stream=stream)
        payload = b"x" * 300
        per_batch: dict[int, float] = {}
        for n, rounds in ((16, 30), (500, 8)):
            t0 = time.perf_counter()
            for r in range(rounds):
                run: list[Message] = [
                    ("bench.batches", payload, {names.MSG_ID_HEADER: f"{n}-{r}-{i}"})
                    for i in range(n)
                ]
                await publisher.publish(run)
            per_batch[n] = (time.perf_counter() - t0) / rounds
        assert publisher.batches == 38, "the scratch stream took no atomic batches"
        per_message = max(0.0, (per_batch[500] - per_batch[16]) / (500 - 16))
        return BatchCost(max(0.0, per_batch[16] - 16 * per_message), per_message)
    finally:
        await js.delete_stream(stream)


async def batched_runs(js: JetStreamContext, stream: str, after_seq: int) -> tuple[int, list[int]]:
    """Of the messages `stream` stored after `after_seq`: how many came one by one, and the size
    of each atomic batch (their headers say: bus/batch.py)."""
    info = await js.stream_info(stream)
    last = info.state.last_seq
    if last <= after_seq:
        return 0, []
    sub = await js.subscribe(
        ">",
        stream=stream,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        config=ConsumerConfig(opt_start_seq=after_seq + 1, headers_only=True),
    )
    single, batches = 0, []
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            headers = msg.headers or {}
            if names.BATCH_ID_HEADER not in headers:
                single += 1
            elif names.BATCH_COMMIT_HEADER in headers:
                batches.append(int(headers[names.BATCH_SEQUENCE_HEADER]))
            if msg.metadata.sequence.stream >= last:
                return single, batches
    finally:
        await sub.unsubscribe()


async def stored_messages(js: JetStreamContext) -> int:
    """Messages every stream has stored so far (KV buckets are streams too)."""
    return sum((await stored_by_stream(js)).values())


async def stored_by_stream(js: JetStreamContext) -> dict[str, int]:
    """Messages each stream has stored so far, by stream name."""
    return {info.config.name or "?": info.state.last_seq for info in await js.streams_info()}


async def _digested(js: JetStreamContext) -> bool:
    """True when no durable consumer has anything left to deliver or to be acked."""
    for info in await js.streams_info():
        for consumer in await js.consumers_info(info.config.name or ""):
            if not consumer.config.durable_name:
                continue  # a watch (an ordered, ephemeral consumer): not work to digest
            if consumer.num_pending or consumer.num_ack_pending:
                return False
    return True


async def until_digested(js: JetStreamContext, within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while not await _digested(js):
        if time.monotonic() > deadline:
            raise TimeoutError("the burst was not digested in time")
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # the outbox relay and the timeline's last commits
