"""A connection's reconnects, as a signal that loops await instead of polling a counter.

Every client made by `connect` has one (`reconnects(nc)`). Its count rises each time nats-py
reconnects, and `wait_beyond(seen)` returns once the count has passed `seen`. It returns at once
if the count passed already, so a reconnect that lands between reading the count and waiting is
never missed.

Losing the connection is signalled too (`down`, and a wake-up). A loop that must act as soon as
the bus is gone uses it: a cache of verified credentials, say, which a revocation missed while
away could keep alive.

Before this module, eight loops each polled `nc.stats["reconnects"]` on a timer of their own,
at 0.25 s to 1 s (issue 37).
"""

from __future__ import annotations

import asyncio
from weakref import WeakKeyDictionary

from nats.aio.client import Client as NATS


class Reconnects:
    """One client's reconnects and losses of its connection."""

    def __init__(self) -> None:
        self.count = 0
        """Reconnects since the client first connected."""
        self.down = False
        """The connection is lost now (nats-py is reconnecting)."""
        self._changed = asyncio.Event()

    def disconnected(self) -> None:
        self.down = True
        self._wake()

    def reconnected(self) -> None:
        self.count += 1
        self.down = False
        self._wake()

    async def wait_beyond(self, seen: int) -> int:
        """Until the count passes `seen` (at once if it has); returns the count."""
        while self.count == seen:
            await self._changed.wait()
        return self.count

    async def passed(self, seen: int, within_s: float) -> bool:
        """Whether the count passes `seen` within `within_s` (a loop's tick that a reconnect
        cuts short)."""
        if self.count != seen:
            return True
        try:
            await asyncio.wait_for(self.wait_beyond(seen), within_s)
        except TimeoutError:
            return False
        return True

    async def changed(self) -> None:
        """Until the next loss or reconnect."""
        await self._changed.wait()

    def _wake(self) -> None:
        # Every waiter holds the event it began waiting on: set that one, and give later
        # waiters a fresh one.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


_BY_CLIENT: WeakKeyDictionary[NATS, Reconnects] = WeakKeyDictionary()


def reconnects(nc: NATS) -> Reconnects:
    """The client's signal: `connect` drives it; any other client's never fires."""
    found = _BY_CLIENT.get(nc)
    if found is None:
        found = _BY_CLIENT[nc] = Reconnects()
    return found
