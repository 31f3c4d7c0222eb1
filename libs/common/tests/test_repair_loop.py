"""The reconnect signal and the one repair loop, against a real nats-server that restarts.

A loop learns of a reconnect from the signal `connect` drives, at once rather than on its next
poll; the repair loop runs a pass at start, after a reconnect, when asked, and again soon after
a failure, and a bug in a pass does not end it.
"""

from __future__ import annotations

import asyncio
import time

from einsora.common.bus import connect, reconnects
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.repair import RepairLoop
from einsora.common.testing import until


async def test_a_reconnect_wakes_a_waiting_loop_and_a_late_waiter_sees_it_too(
    own_nats_server: EmbeddedNats,
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    signal = reconnects(nc)
    seen = signal.count
    waiting = asyncio.ensure_future(signal.wait_beyond(seen))
    lost = asyncio.ensure_future(signal.changed())
    own_nats_server.stop()
    await asyncio.wait_for(lost, 10)  # the loss is signalled as it happens
    down_while_stopped = signal.down
    own_nats_server.start()
    assert await asyncio.wait_for(waiting, 30) == seen + 1
    assert (down_while_stopped, signal.down) == (True, False)
    # A waiter that read the count before the reconnect, and waits only now, returns at once.
    assert await asyncio.wait_for(signal.wait_beyond(seen), 0.1) == seen + 1
    assert not await signal.passed(seen + 1, 0.05)  # nothing since: the tick runs out
    await nc.close()


async def test_the_loop_passes_at_start_when_asked_after_a_reconnect_and_after_a_failure(
    own_nats_server: EmbeddedNats,
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    passes: list[float] = []
    fail = {"next": 0}

    async def repair() -> None:
        if fail["next"]:
            fail["next"] -= 1
            raise ConnectionError("the store is away")  # transient: retried soon
        passes.append(time.monotonic())

    loop = RepairLoop(nc, repair, what="test repair", period_s=3600, retry_s=0.2)
    await loop.start(first_now=True)
    assert len(passes) == 1
    loop.wanted()
    await until(lambda: len(passes) == 2, what="a pass when asked")
    own_nats_server.stop()
    own_nats_server.start()
    await until(lambda: len(passes) == 3, within_s=30, what="a pass after the reconnect")
    fail["next"] = 1
    loop.wanted()
    await until(lambda: len(passes) == 4, what="a pass again soon after a failure")
    assert loop.passes == 4
    await loop.stop()
    await nc.close()


async def test_a_bug_in_a_pass_does_not_end_the_loop(own_nats_server: EmbeddedNats) -> None:
    nc = await connect(own_nats_server.url, name="test")
    calls: list[int] = []

    async def repair() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug")

    loop = RepairLoop(nc, repair, what="test repair", period_s=0.2)
    await loop.start()
    await until(lambda: loop.passes >= 2, what="passes after the bug")
    await loop.stop()
    await nc.close()
