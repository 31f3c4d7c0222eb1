"""Reading machines' rewrites at a bounded pace, the latest kept (issue 34, N7; ADR-0028).

A machine writes its inventory and observed state as often as it likes, and no NATS limit
bounds that rate. What costs the control plane is reading them (parsing, applying, learning
classes), so a reader takes each machine's values through a `Pacer`: a value that comes after
a quiet interval is delivered at once (a machine's first inventory, a normal heartbeat), and
values that come faster are held, each replacing the one before, and the latest is delivered
when the interval is up. One machine rewriting in a loop then costs a reader one value per
interval, whatever it sends. It never drops the last value of a key, and never reorders one
key's values; it must not be used for values where every revision counts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

log = logging.getLogger("einsora.bus.pace")

MACHINE_REPORT_EVERY_S: Final = {"inventory": 1.0, "observed": 0.1}
"""How often a reader takes each kind of a machine's values at most. An inventory changes
rarely; an observed state comes at each heartbeat (seconds apart) and at each workload's change,
which must reach the scheduler promptly."""


class Pacer(Generic[K, V]):
    """Delivers each key's values to `deliver` at most once per `every_s(key)` seconds."""

    def __init__(
        self,
        deliver: Callable[[K, V], None],
        every_s: Callable[[K], float],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deliver = deliver
        self._every_s = every_s
        self._clock = clock
        self._last: dict[K, float] = {}
        self._held: dict[K, V] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self.delivered = 0
        """Values handed to `deliver`."""

    def offer(self, key: K, value: V) -> None:
        """Deliver `value` now, or hold it (in place of any held before it) until its turn."""
        if key in self._held:
            self._held[key] = value
            return
        now = self._clock()
        wait = self._last.get(key, -float("inf")) + self._every_s(key) - now
        if wait <= 0:
            self._last[key] = now
            self.delivered += 1
            self._deliver(key, value)
            return
        self._held[key] = value
        self._timers[key] = asyncio.get_running_loop().call_later(wait, self._release, key)

    def clear(self) -> None:
        """Forget what is held (a reader about to read every key afresh) and when keys were
        last delivered."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._held.clear()
        self._last.clear()

    def _release(self, key: K) -> None:
        self._timers.pop(key, None)
        if key not in self._held:
            return
        value = self._held.pop(key)
        self._last[key] = self._clock()
        self.delivered += 1
        try:
            self._deliver(key, value)
        except Exception:
            # A timer's callback: the loop would only print it. Said once per value, the next
            # value of the key is delivered as usual.
            log.exception("a held value could not be delivered", extra={"key": str(key)})


__all__ = ["MACHINE_REPORT_EVERY_S", "Pacer"]
