"""What the bus itself allows, measured in a benchmark's own run: the durable-write ceiling, the
messages stored meanwhile, and whether the consumers have digested everything."""

from __future__ import annotations

import asyncio
import time

from nats.js import JetStreamContext
from nats.js.api import StreamConfig

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
