"""A machine's values reach a reader at a bounded pace, the latest kept, the first at once."""

from __future__ import annotations

import asyncio

from einsora.common.bus.pace import Pacer

EVERY_S = 0.2


async def test_values_come_at_once_then_at_the_pace_the_latest_kept() -> None:
    got: list[tuple[str, int]] = []
    arrived = asyncio.Event()

    def deliver(key: str, value: int) -> None:
        got.append((key, value))
        arrived.set()

    pacer: Pacer[str, int] = Pacer(deliver, lambda _: EVERY_S)
    loop = asyncio.get_running_loop()
    started = loop.time()
    pacer.offer("m-1", 1)
    assert got == [("m-1", 1)]  # at once
    for value in range(2, 50):
        pacer.offer("m-1", value)  # held, each in place of the one before
    pacer.offer("m-2", 1)  # another key has its own pace
    assert got == [("m-1", 1), ("m-2", 1)]
    arrived.clear()
    await asyncio.wait_for(arrived.wait(), 5)
    assert got[-1] == ("m-1", 49)
    assert loop.time() - started >= EVERY_S * 0.9
    assert pacer.delivered == 3

    # Quiet for an interval: the next value passes at once.
    arrived.clear()
    await asyncio.sleep(EVERY_S)  # the quiet interval itself, not a wait for an event
    pacer.offer("m-1", 50)
    assert got[-1] == ("m-1", 50)
    pacer.offer("m-1", 51)
    pacer.clear()  # a reader about to read every key afresh drops what is held
    await asyncio.sleep(EVERY_S * 1.5)
    assert got[-1] == ("m-1", 50)
