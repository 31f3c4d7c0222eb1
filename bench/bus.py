"""The bus floor: what NATS itself costs on this machine, for later figures to be compared with.

Measures, against a real embedded nats-server with `sync_interval: always`:
a KV put seen by a watcher, a request/reply round trip, and JetStream publish-with-ack
throughput (one at a time, and pipelined).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _harness import report, summary_ms
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from einsora.common.bus import bind_bucket, connect, names, provision, watch_key
from einsora.common.embedded_nats import EmbeddedNats

ROUNDS = 2000
PUBLISHES = 5000


async def kv_watch(js: JetStreamContext) -> list[float]:
    kv = bind_bucket(js, names.MACHINES)
    key = names.desired_key("m-bench")
    sub = await watch_key(js, names.MACHINES, key, names.desired_watch_consumer("m-bench"))
    samples = []
    for i in range(ROUNDS):
        t0 = time.perf_counter()
        await kv.put(key, str(i).encode())
        while True:
            msg = await sub.next_msg(timeout=2)
            if msg.data == str(i).encode():
                break
        samples.append(time.perf_counter() - t0)
    await sub.unsubscribe()
    return samples


async def request_reply(nc: NATS) -> list[float]:
    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("bench.echo", cb=echo)
    samples = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        await nc.request("bench.echo", b"x" * 64, timeout=2)
        samples.append(time.perf_counter() - t0)
    return samples


async def publish_sequential(js: JetStreamContext) -> float:
    payload = b"x" * 256
    t0 = time.perf_counter()
    for i in range(PUBLISHES // 5):
        await js.publish(names.event_subject("w-bench"), payload, headers={"Nats-Msg-Id": f"s{i}"})
    return (PUBLISHES // 5) / (time.perf_counter() - t0)


async def publish_pipelined(js: JetStreamContext) -> float:
    """`publish_async`: acks awaited together, as a relay draining a backlog would."""
    payload = b"x" * 256
    t0 = time.perf_counter()
    futures = [
        await js.publish_async(
            names.event_subject("w-bench"), payload, headers={"Nats-Msg-Id": f"p{i}"}
        )
        for i in range(PUBLISHES)
    ]
    await asyncio.gather(*futures)
    return PUBLISHES / (time.perf_counter() - t0)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp), port=0) as server:
        nc = await connect(server.url, name="bench-bus")
        js = nc.jetstream()
        await provision(js)
        kv = summary_ms(await kv_watch(js))
        rr = summary_ms(await request_reply(nc))
        seq = await publish_sequential(js)
        pipe = await publish_pipelined(js)
        await nc.close()
    figures = {
        "kv_watch_p50_ms": kv["p50"],
        "kv_watch_p99_ms": kv["p99"],
        "request_reply_p50_ms": rr["p50"],
        "request_reply_p99_ms": rr["p99"],
        "js_publish_sequential_per_s": round(seq),
        "js_publish_pipelined_per_s": round(pipe),
    }
    report(
        "bus",
        [
            ("KV put seen by a watcher", f"p50 {kv['p50']} ms, p99 {kv['p99']} ms ({ROUNDS} puts)"),
            ("request/reply round trip", f"p50 {rr['p50']} ms, p99 {rr['p99']} ms ({ROUNDS})"),
            ("JetStream publish, awaited one by one", f"{seq:,.0f} msg/s"),
            ("JetStream publish_async, acks awaited together", f"{pipe:,.0f} msg/s"),
        ],
        figures,
    )


if __name__ == "__main__":
    asyncio.run(main())
