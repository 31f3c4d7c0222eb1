"""Start-up that outlasts an outage: each step of a service's start is tried again after a
transient failure, with capped and jittered back-off, until it succeeds or the service is
stopped (issue 35, F5).

A cell's services start in any order and restart at any time: accounting restarted just before
a NATS node was lost, met `nats: timeout` in its first JetStream call, and exited for good.
What can fail and then succeed unchanged (NATS away, a stream without a leader yet, the
database restarting: `transient.is_transient`, and an `EinsoraError` that says a retry can
help, such as `BusUnavailable`) is waited out here, said once in the log when it starts and
once when it ends. Everything else (a refused credential, a taken port, a bad setting) still
stops the start at once, with its own message: waiting would not cure it.

A step must be safe to run again after it failed: it leaves nothing behind, or what it leaves
is taken over by its next run (a consumer declared twice is one consumer).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from einsora.common.errors import EinsoraError
from einsora.common.runloop import raise_if_cancelled
from einsora.common.transient import is_transient

T = TypeVar("T")

log = logging.getLogger("einsora.startup")

FIRST_RETRY_S = 0.25
"""The wait before a failed step's second try; it doubles after each failure, up to the cap."""

RETRY_CAP_S = 5.0
"""The longest wait between two tries: a step succeeds within about this long of its cause
being cured (NATS back, the stream's leader elected)."""


def retryable(exc: BaseException) -> bool:
    """Whether a start-up step that raised `exc` may succeed if tried again unchanged."""
    if isinstance(exc, EinsoraError):
        return exc.retryable
    return is_transient(exc)


def backoff(attempt: int, *, first_s: float = FIRST_RETRY_S, cap_s: float = RETRY_CAP_S) -> float:
    """The wait after the `attempt`-th failure (1, 2, …): doubling from `first_s` up to
    `cap_s`, drawn from its upper half, so services that failed together do not retry as one."""
    base = min(cap_s, first_s * 2 ** min(attempt - 1, 32))
    return random.uniform(base / 2, base)


async def retrying(
    what: str,
    step: Callable[[], Awaitable[T]],
    *,
    service: str,
    cap_s: float = RETRY_CAP_S,
) -> T:
    """Run `step` until it succeeds, again after each retryable failure; what it returns.

    `what` names the step for a person ("connecting to NATS"), `service` who is starting. A
    failure that is not retryable is raised as it is; so is cancellation (the service was
    stopped while it waited)."""
    began = time.monotonic()
    attempt = 0
    while True:
        raise_if_cancelled()
        attempt += 1
        try:
            result = await step()
        except Exception as exc:
            if not retryable(exc):
                raise
            if attempt == 1:
                log.warning(
                    "start-up step failed; retrying with back-off",
                    extra={"service": service, "step": what, "error": _said(exc)},
                )
            await asyncio.sleep(backoff(attempt, cap_s=cap_s))
            continue
        if attempt > 1:
            log.info(
                "start-up step done after retries",
                extra={
                    "service": service,
                    "step": what,
                    "attempts": attempt,
                    "after_s": round(time.monotonic() - began, 3),
                },
            )
        return result


def _said(exc: BaseException) -> str:
    """What a person reads of a failure: our own message, else the library's with its type
    (nats-py's timeouts say only "nats: timeout")."""
    if isinstance(exc, EinsoraError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
