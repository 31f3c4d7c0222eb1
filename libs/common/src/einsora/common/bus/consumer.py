"""A durable pull consumer with a stated ack policy: the one way services consume streams.

Each message is handled, then acked only after its side effect is committed. What happens when
the handler raises is decided by what it raised, and nothing but poison is ever given up on:

- a retryable `EinsoraError` (the store is unavailable), a transient failure of the bus or the
  store (`transient.is_transient`: Postgres refusing connections, a request nobody answers), or
  any other exception (a bug, which a fix and a restart will get past) is `nak`ed with a
  capped exponential back-off and jitter, for as long as it takes: the consumer has no delivery
  cap (`max_deliver` -1), because a cap would silently drop intents and timeline events during
  an outage longer than the retries;
- poison, a non-retryable `EinsoraError` or a message that cannot be parsed (a pydantic
  `ValidationError`), is `term`inated at once, logged at ERROR with its subject, stream sequence,
  consumer and reason, and counted.

Every retry and termination is counted by reason in the consumer (`redelivered`, `terminated`)
and, where `prometheus_client` is installed (the api; the agent installs without it), in a
Prometheus registry too. A lost connection or a fetch timeout never ends the loop; `stop()` does.

A consumer may also take each fetched batch at once (`batch_handler`: one store transaction for
many messages), all acked after it returns; when it raises, the batch is handled again one
message at a time with `handler`, so each message still gets its own ack, nak or term. A
retryable failure of one message (the store away) naks the rest of its fetch at once, rather
than trying each in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from einsora.common import logs
from einsora.common.bus import names
from einsora.common.errors import EinsoraError
from einsora.common.failures import log_failure, outlives
from einsora.common.runloop import raise_if_cancelled
from einsora.common.transient import is_transient

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client import Counter as PrometheusCounter

    _HAVE_PROMETHEUS: bool = True
except ImportError:  # The agent and the CLI install without it; the counts stay in the consumer.
    _HAVE_PROMETHEUS = False

log = logging.getLogger("einsora.bus.consumer")

Handler = Callable[[Msg], Awaitable[None]]
BatchHandler = Callable[[Sequence[Msg]], Awaitable[None]]
Uniform = Callable[[float, float], float]

UNLIMITED_DELIVERIES = -1
"""The consumers' `max_deliver`: a message is delivered until it is acked or terminated."""

RETRY_FIRST_S = 0.2
"""Delay before the second delivery of a message whose handler failed and may succeed later."""

RETRY_CAP_S = 30.0
"""The longest base delay between two deliveries (the delay doubles up to it): once the store is
back, every waiting message is handled again within about this long."""

RETRY_JITTER = 0.2
"""Each delay is spread uniformly by ±this fraction of its base, so messages that failed together
(a store outage) do not all come back in the same instant; a delay at the cap is at most
`RETRY_CAP_S * (1 + RETRY_JITTER)`."""

_MAX_DOUBLINGS = 64
"""Enough doublings to reach any cap; bounds the exponent of a message delivered for days."""

_DECLARED = (
    "filter_subject",
    "ack_policy",
    "deliver_policy",
    "max_deliver",
    "ack_wait",
    "max_ack_pending",
)
"""Consumer settings we declare and keep up to date on an existing durable consumer."""


class Reason(StrEnum):
    """Why a message was redelivered or terminated: the label of the counts."""

    retryable = "retryable"
    """Redelivered: the handler raised a retryable `EinsoraError` or a transient failure."""
    unexpected = "unexpected"
    """Redelivered: the handler raised something that is not an `EinsoraError` (a bug)."""
    non_retryable = "non_retryable"
    """Terminated: the handler raised a non-retryable `EinsoraError` (poison)."""
    unparseable = "unparseable"
    """Terminated: the handler could not parse the message (a pydantic `ValidationError`)."""


def retry_delay(
    deliveries: int,
    *,
    first_s: float = RETRY_FIRST_S,
    cap_s: float = RETRY_CAP_S,
    jitter: float = RETRY_JITTER,
    uniform: Uniform = random.uniform,
) -> float:
    """The delay before the next delivery of a message delivered `deliveries` times so far.

    `first_s` doubled at each delivery up to `cap_s`, then spread by ±`jitter` of itself.
    """
    doublings = min(max(deliveries, 1) - 1, _MAX_DOUBLINGS)
    base = min(cap_s, first_s * 2.0**doublings)
    return base * uniform(1.0 - jitter, 1.0 + jitter)


class DurableConsumer:
    """Runs `handler` over every message of `filter_subject` in `stream`, in order.

    `terminated` and `redelivered` count this consumer's terminations and retries by `Reason`.
    """

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str,
        durable: str,
        filter_subject: str,
        handler: Handler,
        batch: int = 64,
        ack_wait: float = 30.0,
        max_ack_pending: int = 1000,
        fetch_wait_s: float = 0.5,
        batch_handler: BatchHandler | None = None,
        retry_first_s: float = RETRY_FIRST_S,
        retry_cap_s: float = RETRY_CAP_S,
        retry_jitter: float = RETRY_JITTER,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not 0 < retry_first_s <= retry_cap_s:
            raise ValueError("retry delays must satisfy 0 < retry_first_s <= retry_cap_s")
        if not 0 <= retry_jitter < 1:
            raise ValueError("retry_jitter is a fraction of the delay, in [0, 1)")
        self._js = js
        self._stream = stream
        self._durable = durable
        self._handler = handler
        self._batch_handler = batch_handler
        self._batch = batch
        self._retry_first_s = retry_first_s
        self._retry_cap_s = retry_cap_s
        self._retry_jitter = retry_jitter
        self._fetch_wait_s = fetch_wait_s
        self._config = ConsumerConfig(
            durable_name=durable,
            filter_subject=filter_subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_deliver=UNLIMITED_DELIVERIES,
            ack_wait=ack_wait,
            max_ack_pending=max_ack_pending,
        )
        self.terminated: Counter[str] = Counter()
        self.redelivered: Counter[str] = Counter()
        self._exported = _prometheus_counters(registry)
        if self._exported is not None:  # every series from the start, at zero
            for reason in (Reason.retryable, Reason.unexpected):
                self._exported[0].labels(durable, reason)
            for reason in (Reason.non_retryable, Reason.unparseable):
                self._exported[1].labels(durable, reason)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Declare the consumer (create it, or update one declared otherwise) and consume."""
        await self._declare()
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name=f"consumer {self._durable}")

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop after the current fetch; messages already fetched are handled first.

        Cancelling a fetch in flight would leave its pull request open on the server, and a
        message delivered to it would wait `ack_wait` before anyone sees it again.
        """
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(task, grace_s)
        except TimeoutError:
            log.warning("consumer did not stop in time", extra={"consumer": self._durable})

    async def _declare(self) -> None:
        # A durable made by older code keeps its settings (max_deliver=20 dropped messages) until
        # it is updated; adding a durable that exists with other settings updates it in place.
        try:
            info = await self._js.consumer_info(self._stream, self._durable)
        except NotFoundError:
            await self._js.add_consumer(self._stream, self._config)
            log.info("consumer created", extra={"consumer": self._durable})
            return
        wanted: dict[str, Any] = self._config.as_dict()
        current: dict[str, Any] = info.config.as_dict()
        changed = sorted(k for k in _DECLARED if current.get(k) != wanted[k])
        if changed:
            await self._js.add_consumer(self._stream, self._config)
            log.info("consumer updated", extra={"consumer": self._durable, "fields": changed})

    async def _run(self) -> None:
        sub = None
        while not self._stopping.is_set():
            raise_if_cancelled()  # nats-py turns a cancelled fetch into a timeout
            try:
                if sub is None:
                    sub = await self._js.pull_subscribe_bind(
                        durable=self._durable, stream=self._stream
                    )
                msgs = await sub.fetch(self._batch, timeout=self._fetch_wait_s)
            except TimeoutError:  # nats-py's own too: nothing to fetch yet
                continue
            except Exception as exc:
                # Disconnected or the server is restarting: wait for the client to reconnect. A
                # refusal by the bus is retried as well, with its traceback.
                raise_if_cancelled()
                if not outlives(exc, nats.errors.Error):
                    raise
                log_failure(log, "fetch failed; retrying", exc, {"consumer": self._durable})
                await asyncio.sleep(0.5)
                continue
            if self._batch_handler is not None and len(msgs) > 1:
                await self._handle_batch(self._batch_handler, msgs)
                continue
            await self._handle_each(msgs)

    async def _handle_batch(self, batch_handler: BatchHandler, msgs: Sequence[Msg]) -> None:
        try:
            await batch_handler(msgs)
        except Exception as exc:
            # Handlers are idempotent, so what the batch did commit is skipped the second time.
            log.warning(
                "batch failed; handling its messages one by one",
                extra={"consumer": self._durable, "size": len(msgs), "error": repr(exc)},
            )
            await self._handle_each(msgs)
            return
        for msg in msgs:
            await _quietly(msg.ack())

    async def _handle_each(self, msgs: Sequence[Msg]) -> None:
        for i, msg in enumerate(msgs):
            transient = await self._handle(msg)
            if transient is not None:
                # The store or the lease is away, not this message at fault: the rest would
                # each fail the same way, one slow try after another. They wait their turn.
                for rest in msgs[i + 1 :]:
                    await self._retry(rest, Reason.retryable, transient)
                return

    async def _handle(self, msg: Msg) -> Exception | None:
        """Handle one message and ack, nak or term it; the error when it failed for a reason
        that is not its own (a retryable `EinsoraError`, a transient failure), else None."""
        request_id = names.REQUEST_ID_HEADER
        with logs.bind(request_id=(msg.headers or {}).get(request_id), subject=msg.subject):
            try:
                await self._handler(msg)
            except EinsoraError as exc:
                if exc.retryable:
                    await self._retry(msg, Reason.retryable, exc)
                    return exc
                await self._terminate(msg, Reason.non_retryable, f"{exc.code}: {exc.message}")
                return None
            except ValidationError as exc:
                await self._terminate(msg, Reason.unparseable, _validation_summary(exc))
                return None
            except Exception as exc:
                if is_transient(exc):  # the bus or the store away, as a retryable error says
                    await self._retry(msg, Reason.retryable, exc)
                    return exc
                log.exception("handler failed", extra={"consumer": self._durable})
                await self._retry(msg, Reason.unexpected, exc)
                return None
            await _quietly(msg.ack())
            return None

    async def _retry(self, msg: Msg, reason: Reason, exc: Exception) -> None:
        deliveries = msg.metadata.num_delivered or 1
        delay = retry_delay(
            deliveries,
            first_s=self._retry_first_s,
            cap_s=self._retry_cap_s,
            jitter=self._retry_jitter,
        )
        self.redelivered[reason] += 1
        if self._exported is not None:
            self._exported[0].labels(self._durable, reason).inc()
        log.warning(
            "message will be retried",
            extra={
                "consumer": self._durable,
                "subject": msg.subject,
                "stream_seq": msg.metadata.sequence.stream,
                "deliveries": deliveries,
                "delay_s": delay,
                "reason": reason.value,
                "error": repr(exc),
            },
        )
        await _quietly(msg.nak(delay=delay))

    async def _terminate(self, msg: Msg, reason: Reason, detail: str) -> None:
        seq = msg.metadata.sequence.stream
        self.terminated[reason] += 1
        if self._exported is not None:
            self._exported[1].labels(self._durable, reason).inc()
        # The fields are in the text too: a terminated message is never seen again, and the
        # text format shows no extras.
        log.error(
            "message terminated: %s seq %d on %s by %s (%s): %s",
            msg.subject,
            seq,
            self._stream,
            self._durable,
            reason.value,
            detail,
            extra={
                "consumer": self._durable,
                "subject": msg.subject,
                "stream_seq": seq,
                "deliveries": msg.metadata.num_delivered,
                "reason": reason.value,
                "error": detail,
            },
        )
        await _quietly(msg.term())


def _validation_summary(exc: ValidationError) -> str:
    """Where and why parsing failed, without the input: a message may carry secrets."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
        for e in exc.errors(include_input=False, include_url=False)
    )


_Exported = tuple["PrometheusCounter", "PrometheusCounter"]
_EXPORTED: weakref.WeakKeyDictionary[Any, _Exported] = weakref.WeakKeyDictionary()


def _prometheus_counters(registry: CollectorRegistry | None) -> _Exported | None:
    """The (redelivered, terminated) counters in `registry` (the default one when None), made
    once per registry; None where `prometheus_client` is not installed."""
    if not _HAVE_PROMETHEUS:
        return None
    target = REGISTRY if registry is None else registry
    exported = _EXPORTED.get(target)
    if exported is None:
        labels = ("consumer", "reason")
        exported = (
            PrometheusCounter(
                "einsora_bus_messages_redelivered",
                "Messages a durable consumer nak'ed for a later delivery, by consumer and reason",
                labels,
                registry=target,
            ),
            PrometheusCounter(
                "einsora_bus_messages_terminated",
                "Messages a durable consumer terminated (never delivered again), by consumer "
                "and reason",
                labels,
                registry=target,
            ),
        )
        _EXPORTED[target] = exported
    return exported


async def _quietly(ack: Awaitable[None]) -> None:
    """An ack lost with the connection is redelivered later; consumers are idempotent."""
    with contextlib.suppress(nats.errors.Error, OSError):
        await ack
