"""Publishing a run of messages to one stream: many as atomic batches, a few one by one.

With `sync_interval: always` nats-server fsyncs every JetStream message it stores, about 4,500 a
second on this machine kind whoever publishes: a burst of launches spends most of that on the
scheduler's events and the api's intents. An atomic batch (nats-server 2.12+, a stream with
`allow_atomic`) is stored with one commit instead. A commit costs more than one message (about
2.4 ms against 0.4 ms for a lone publish here), so a batch pays from about ten messages and a
shorter run goes out pipelined, message by message, as before (a lone event keeps its latency).

Every message must carry a `Nats-Msg-Id`: a batch holding a message JetStream already stored is
refused whole ("duplicate message id"), and is then sent again message by message, where each
duplicate is dropped on its own. So is a batch refused for any other reason, or whose commit is
not acked in time: what the caller gets back is, per message, its ack or why it failed, exactly
as for pipelined publishes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck

from einsora.common.bus import names

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client import Counter as PrometheusCounter

    _HAVE_PROMETHEUS: bool = True
except ImportError:  # the agent and the CLI install without it (and publish no batches)
    _HAVE_PROMETHEUS = False

log = logging.getLogger("einsora.bus.batch")

MAX_BATCH = 1000
"""The most messages nats-server takes in one atomic batch."""
MIN_BATCH = 16
"""Fewer messages than this go out one by one: a commit costs about six lone publishes."""
RETRY_ATOMIC_AFTER_S = 60.0
"""After a stream said it takes no atomic batches, how long to send it messages one by one
before asking again (an operator may enable them meanwhile; the api's provisioning does)."""

Message = tuple[str, bytes, dict[str, str]]
"""(subject, payload, headers), the headers carrying the message's `Nats-Msg-Id`."""
Outcome = PubAck | BaseException


ATOMIC_DISABLED = 10174
"""JetStream's error code for a batch sent to a stream without `allow_atomic`."""


class BatchRefused(Exception):
    """nats-server refused an atomic batch (the batch is then sent message by message)."""

    def __init__(self, description: str, err_code: int | None = None) -> None:
        super().__init__(description)
        self.err_code = err_code


class BatchPublisher:
    """Publishes runs of messages to one stream, as atomic batches where that pays.

    With `prometheus_client` installed it counts, in `registry` (the default one when None),
    `einsora_bus_atomic_batches_total{stream}` (batches stored),
    `einsora_bus_messages_batched_total{stream}` (the messages in them) and
    `einsora_bus_atomic_batches_refused_total{stream}` (batches sent again one by one).
    """

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        *,
        stream: str,
        timeout_s: float = 5.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._nc = nc
        self._js = js
        self._stream = stream
        self._timeout = timeout_s
        self._atomic_refused_at: float | None = None
        self.batches = 0
        """Atomic batches stored."""
        self.batched = 0
        """Messages stored in them."""
        exported = _prometheus_counters(registry)
        self._exported = None if exported is None else tuple(c.labels(stream) for c in exported)

    async def publish(self, messages: Sequence[Message]) -> list[Outcome]:
        """Publish `messages` in order; each one's ack, or the exception that says why it was
        not stored, never waiting longer than the timeout for any part."""
        outcomes: list[Outcome] = []
        for start in range(0, len(messages), MAX_BATCH):
            chunk = messages[start : start + MAX_BATCH]
            if len(chunk) >= MIN_BATCH and self._atomic_allowed():
                try:
                    outcomes.extend(await self._atomic(chunk))
                    continue
                except Exception as exc:  # refused, unanswered or cut off: one by one instead
                    self._refused(exc)
                    if self._exported is not None:
                        self._exported[2].inc()
            outcomes.extend(await self._one_by_one(chunk))
        return outcomes

    def _atomic_allowed(self) -> bool:
        refused_at = self._atomic_refused_at
        return refused_at is None or time.monotonic() - refused_at > RETRY_ATOMIC_AFTER_S

    def _refused(self, exc: BaseException) -> None:
        if isinstance(exc, BatchRefused) and exc.err_code == ATOMIC_DISABLED:
            if self._atomic_refused_at is None:
                log.warning(
                    "stream takes no atomic batches; publishing one by one",
                    extra={"stream": self._stream},
                )
            self._atomic_refused_at = time.monotonic()
            return
        log.info(
            "atomic batch not stored; publishing its messages one by one",
            extra={"stream": self._stream, "error": repr(exc)},
        )

    async def _atomic(self, chunk: Sequence[Message]) -> list[Outcome]:
        batch_id = secrets.token_hex(12)
        marked = [
            {**headers, names.BATCH_ID_HEADER: batch_id, names.BATCH_SEQUENCE_HEADER: str(i)}
            for i, (_, _, headers) in enumerate(chunk, 1)
        ]
        assert all(names.MSG_ID_HEADER in h for h in marked), "a batched message needs its id"
        marked[-1][names.BATCH_COMMIT_HEADER] = "1"
        *staged, (subject, payload, _) = chunk
        for (s, p, _), headers in zip(staged, marked, strict=False):
            await self._nc.publish(s, p, headers=headers)
        reply = await self._nc.request(subject, payload, timeout=self._timeout, headers=marked[-1])
        answer = json.loads(reply.data)
        if "error" in answer:
            error = answer["error"]
            raise BatchRefused(error.get("description", "refused"), error.get("err_code"))
        if answer.get("count") != len(chunk):
            raise BatchRefused(f"stored {answer.get('count')} of {len(chunk)}")
        self._atomic_refused_at = None
        self.batches += 1
        self.batched += len(chunk)
        if self._exported is not None:
            self._exported[0].inc()
            self._exported[1].inc(len(chunk))
        first = int(answer["seq"]) - len(chunk) + 1
        stream = answer.get("stream", self._stream)
        return [PubAck(stream=stream, seq=first + i, batch_id=batch_id) for i in range(len(chunk))]

    async def _one_by_one(self, chunk: Sequence[Message]) -> list[Outcome]:
        futures, failure = await publish_pipelined(self._js, chunk)
        outcomes = await settle(futures, self._timeout)
        unsent = failure or ConnectionError("not sent")
        outcomes.extend(unsent for _ in range(len(chunk) - len(outcomes)))
        return outcomes


async def publish_pipelined(
    js: JetStreamContext, messages: Iterable[tuple[str, bytes, dict[str, str] | None]]
) -> tuple[list[asyncio.Future[PubAck]], Exception | None]:
    """Publish each message without waiting for its ack: the acks to come, and why the rest
    were not sent when one could not be (they count as failed, for the caller to retry)."""
    futures: list[asyncio.Future[PubAck]] = []
    try:
        for subject, payload, headers in messages:
            futures.append(await js.publish_async(subject, payload, headers=headers))
    except Exception as exc:
        return futures, exc
    return futures, None


async def settle(futures: Sequence[asyncio.Future[PubAck]], timeout_s: float) -> list[Outcome]:
    """Each publish's ack, or the exception that says why it has none, in order; never waits
    longer than `timeout_s`, and cancels what is still unanswered then."""
    if not futures:
        return []
    done, pending = await asyncio.wait(futures, timeout=timeout_s)
    for future in pending:
        future.cancel()
    outcomes: list[Outcome] = []
    for future in futures:
        if future not in done or future.cancelled():
            outcomes.append(TimeoutError("no ack in time"))
        else:
            outcomes.append(future.exception() or future.result())
    return outcomes


_EXPORTED: weakref.WeakKeyDictionary[Any, tuple[Any, Any, Any]] = weakref.WeakKeyDictionary()


def _prometheus_counters(registry: CollectorRegistry | None) -> tuple[Any, Any, Any] | None:
    """The (batches, messages batched, batches refused) counters in `registry`, made once per
    registry; None where `prometheus_client` is not installed."""
    if not _HAVE_PROMETHEUS:
        return None
    target = REGISTRY if registry is None else registry
    exported = _EXPORTED.get(target)
    if exported is None:
        exported = (
            PrometheusCounter(
                "einsora_bus_atomic_batches",
                "Atomic batches JetStream stored, by stream",
                ["stream"],
                registry=target,
            ),
            PrometheusCounter(
                "einsora_bus_messages_batched",
                "Messages stored in atomic batches, by stream",
                ["stream"],
                registry=target,
            ),
            PrometheusCounter(
                "einsora_bus_atomic_batches_refused",
                "Atomic batches refused or unanswered, then sent message by message, by stream",
                ["stream"],
                registry=target,
            ),
        )
        _EXPORTED[target] = exported
    return exported
