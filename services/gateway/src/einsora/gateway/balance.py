"""Which replica a request tries first, second and third.

Replicas take turns (round robin per model). A replica that refused a connection, timed out
connecting, or failed before a byte reached the client is avoided for a few seconds: it goes to
the back of the order rather than out of it, so a model whose every replica failed recently is
still tried instead of refused without asking.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from einsora.common.schemas import Route

AVOID_S = 5.0
MAX_TRIES = 3


class Balancer:
    """Round robin over a model's replicas, with recently failed ones tried last."""

    def __init__(
        self,
        *,
        avoid_s: float = AVOID_S,
        max_tries: int = MAX_TRIES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._avoid_s = avoid_s
        self._max_tries = max_tries
        self._monotonic = monotonic
        self._turn = 0
        self._avoided: dict[str, float] = {}

    def order(self, replicas: Sequence[Route]) -> list[Route]:
        """Up to `max_tries` replicas, in the order to try them."""
        n = len(replicas)
        if n == 1:
            return [replicas[0]]
        # One counter for every model: each model still sees its replicas in turn, and a
        # request costs one increment rather than a lookup.
        self._turn += 1
        start = self._turn % n
        rotated = [replicas[(start + i) % n] for i in range(n)]
        if self._avoided:
            now = self._monotonic()
            fresh: list[Route] = []
            stale: list[Route] = []
            for route in rotated:
                (stale if self._is_avoided(route.workload_id, now) else fresh).append(route)
            rotated = fresh + stale
        return rotated[: self._max_tries]

    def failed(self, route: Route) -> None:
        """`route` failed before answering: try it last for the next few seconds."""
        self._avoided[route.workload_id] = self._monotonic() + self._avoid_s

    def _is_avoided(self, workload_id: str, now: float) -> bool:
        until = self._avoided.get(workload_id)
        if until is None:
            return False
        if until <= now:
            del self._avoided[workload_id]
            return False
        return True
