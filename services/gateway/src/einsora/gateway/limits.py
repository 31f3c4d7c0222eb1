"""Requests and tokens per minute per key, exact across every gateway replica.

Each key's use in one Unix minute is one value of the `gateway_limits` bucket,
`{"requests": n, "tokens": n}` at `<key id>.<minute>`, changed only by compare-and-set on the
key's revision (`create` when new, `update` with the last revision otherwise; a conflict means
another replica wrote first, so the value is read again and the change re-applied). A request
reserves at admission one request and its prompt tokens plus its `max_tokens`, so a burst cannot
overrun the limit; when the answer is known, the real count replaces the reservation (in the
minute it was made in), and a request no replica answered gives its tokens back.

Within one process, the requests of one key and minute are applied in batches: while one
compare-and-set is in flight the next requests queue, and the next write decides all of them in
arrival order. A burst of 50 therefore costs a few writes, not 50 rounds of conflicts; across
replicas the revision check keeps it exact. A refusal is only ever decided on a value just read
from the bucket, never on this process's possibly stale copy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from einsora.common.bus import bind_bucket, names
from einsora.common.failures import outlives

log = logging.getLogger("einsora.gateway.limits")

MAX_CONFLICTS = 100
"""Compare-and-set rounds one batch may lose to other replicas before it gives up."""
SETTLE_TRIES = 5
KEEP_MINUTES = 2
"""Windows kept in memory behind the current one, for late settlements (the bucket keeps 3)."""


class LimitsUnavailable(Exception):
    """The shared counters could not be read or written (NATS down, or endless contention)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one admitted request holds in its key's window, until settled."""

    key_id: str
    minute: int
    tokens: int
    counts_tokens: bool
    """Whether the key has a tokens limit (if not, only requests are counted)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was not admitted, and when to try again."""

    limit: str
    """`requests` or `tokens`."""
    allowed: int
    retry_after_s: int
    too_large: bool = False
    """The request alone needs more tokens than the limit allows in a minute."""


@dataclass(slots=True)
class _Reserve:
    rpm: int | None
    tpm: int | None
    tokens: int
    done: asyncio.Future[Refusal | None]


@dataclass(slots=True)
class _Adjust:
    tokens: int
    tries: int = 0


@dataclass(slots=True)
class _Window:
    """One key's counters in one minute, as last read or written by this process."""

    kv_key: str
    minute: int
    requests: int = 0
    tokens: int = 0
    revision: int | None = None
    """None: not known (read before writing); 0: the bucket has no value for it."""
    queue: list[_Reserve | _Adjust] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None


def retry_after(minute: int, now: float) -> int:
    """Whole seconds until `minute`'s window ends, at least 1."""
    return max(1, math.ceil((minute + 1) * 60 - now))


class LimitBook:
    """Admits requests against their key's limits and settles them with real counts."""

    def __init__(self, js: JetStreamContext, clock: Callable[[], float]) -> None:
        self._kv = bind_bucket(js, names.GATEWAY_LIMITS)
        self._clock = clock
        self._windows: dict[tuple[str, int], _Window] = {}
        self._current_minute = 0

    async def reserve(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens: int
    ) -> Reservation | Refusal:
        """Reserve one request and `tokens` in the current minute, or say why not.

        Raises LimitsUnavailable when the shared counters cannot be reached.
        """
        now = self._clock()
        minute = int(now // 60)
        if tpm is not None and tokens > tpm:
            return Refusal("tokens", tpm, retry_after(minute, now), too_large=True)
        counts_tokens = tpm is not None
        reserved = tokens if counts_tokens else 0
        window = self._window(key_id, minute)
        done: asyncio.Future[Refusal | None] = asyncio.get_running_loop().create_future()
        self._submit(window, _Reserve(rpm, tpm, reserved, done))
        refusal = await done
        if refusal is not None:
            return refusal
        return Reservation(key_id, minute, reserved, counts_tokens)

    def settle(self, reservation: Reservation, real_tokens: int) -> None:
        """Replace a reservation's tokens with the real count (0: no answer), in its minute.

        Queued, not awaited: the answer never waits for the bucket.
        """
        delta = real_tokens - reservation.tokens
        if delta == 0 or not reservation.counts_tokens:
            return
        window = self._windows.get((reservation.key_id, reservation.minute))
        if window is None:
            return  # long past: its value has expired from the bucket as well
        self._submit(window, _Adjust(delta))

    async def stop(self) -> None:
        workers = [w.worker for w in self._windows.values() if w.worker is not None]
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    def _window(self, key_id: str, minute: int) -> _Window:
        if minute != self._current_minute:
            self._current_minute = minute
            self._forget_before(minute - KEEP_MINUTES)
        window = self._windows.get((key_id, minute))
        if window is None:
            window = _Window(names.gateway_limit_key(key_id, minute), minute)
            self._windows[(key_id, minute)] = window
        return window

    def _forget_before(self, minute: int) -> None:
        old = [k for k, w in self._windows.items() if w.minute < minute and w.worker is None]
        for k in old:
            del self._windows[k]

    def _submit(self, window: _Window, op: _Reserve | _Adjust) -> None:
        window.queue.append(op)
        if window.worker is None:
            window.worker = asyncio.create_task(self._drain(window), name="gateway limits")

    async def _drain(self, window: _Window) -> None:
        try:
            while window.queue:
                batch, window.queue = window.queue, []
                try:
                    await self._apply(window, batch)
                except Exception as exc:
                    window.revision = None
                    if not outlives(exc, LimitsUnavailable):
                        # A fault of ours, or a refusal by the bus: said with its traceback,
                        # and this batch's requests refused rather than left waiting for ever.
                        log.exception("rate-limit batch failed", extra={"key": window.kv_key})
                    self._failed(window, batch, exc)
                    if window.queue and outlives(exc, LimitsUnavailable, nats.errors.Error):
                        await asyncio.sleep(0.2)  # the bus is down: do not spin on it
        finally:
            window.worker = None

    def _failed(self, window: _Window, batch: list[_Reserve | _Adjust], exc: Exception) -> None:
        log.warning(
            "rate-limit counters unavailable", extra={"key": window.kv_key, "error": repr(exc)}
        )
        for op in batch:
            if isinstance(op, _Reserve):
                if not op.done.done():
                    op.done.set_exception(LimitsUnavailable(str(exc)))
            elif op.tries + 1 < SETTLE_TRIES:
                op.tries += 1
                window.queue.append(op)
            else:
                log.error(
                    "a settlement was lost: the bus did not answer",
                    extra={"key": window.kv_key, "tokens": op.tokens},
                )

    async def _apply(self, window: _Window, batch: list[_Reserve | _Adjust]) -> None:
        fresh = False
        for _ in range(MAX_CONFLICTS):
            if window.revision is None:
                await self._load(window)
                fresh = True
            requests, tokens, decisions = self._decide(window, batch)
            if not fresh and any(d is not None for d in decisions):
                # A refusal on a copy that may be stale (another replica may have settled
                # tokens back since) is not decided here: read the bucket, then decide.
                window.revision = None
                continue
            if (requests, tokens) != (window.requests, window.tokens):
                value = json.dumps({"requests": requests, "tokens": tokens}).encode()
                try:
                    if window.revision == 0:
                        revision = await self._kv.create(window.kv_key, value)
                    else:
                        revision = await self._kv.update(window.kv_key, value, last=window.revision)
                except KeyWrongLastSequenceError:
                    window.revision = None  # another replica wrote first: read, decide again
                    continue
                window.requests, window.tokens, window.revision = requests, tokens, revision
            for op, decision in zip(batch, decisions, strict=True):
                if isinstance(op, _Reserve) and not op.done.done():
                    op.done.set_result(decision)
            return
        raise LimitsUnavailable("the counters changed under every attempt to update them")

    def _decide(
        self, window: _Window, batch: list[_Reserve | _Adjust]
    ) -> tuple[int, int, list[Refusal | None]]:
        requests, tokens = window.requests, window.tokens
        decisions: list[Refusal | None] = []
        now = self._clock()
        for op in batch:
            if isinstance(op, _Adjust):
                tokens = max(0, tokens + op.tokens)
                decisions.append(None)
            elif op.rpm is not None and requests + 1 > op.rpm:
                decisions.append(Refusal("requests", op.rpm, retry_after(window.minute, now)))
            elif op.tpm is not None and tokens + op.tokens > op.tpm:
                decisions.append(Refusal("tokens", op.tpm, retry_after(window.minute, now)))
            else:
                requests += 1
                tokens += op.tokens
                decisions.append(None)
        return requests, tokens, decisions

    async def _load(self, window: _Window) -> None:
        try:
            entry = await self._kv.get(window.kv_key)
        except KeyNotFoundError:
            window.requests, window.tokens, window.revision = 0, 0, 0
            return
        requests, tokens = 0, 0
        try:
            data = json.loads(entry.value or b"{}")
            requests, tokens = int(data.get("requests", 0)), int(data.get("tokens", 0))
        except (ValueError, TypeError, AttributeError):
            log.warning("unreadable rate-limit counters replaced", extra={"key": window.kv_key})
        window.requests, window.tokens, window.revision = requests, tokens, entry.revision or 0
