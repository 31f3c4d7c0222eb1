"""What the engine tells the rest of the scheduler, as it goes: a committed cycle's changes, a
cycle's time. The metrics (metrics.py) listen; the engine itself stays one loop over the book.

The default hooks do nothing, so an engine built alone (tests, benchmarks) needs none.
"""

from __future__ import annotations

from einsora.scheduler.book import Changes


class EngineHooks:
    """No-op hooks; `SchedulerMetrics` overrides them."""

    def committed(self, changes: Changes) -> None:
        """A cycle's decisions are in the store (called before they are projected)."""

    def cycled(self, seconds: float, *, failed: bool) -> None:
        """A cycle took `seconds` to decide and commit (`failed`: it was rolled back)."""
