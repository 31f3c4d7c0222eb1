"""A durable pull consumer with a stated ack policy: the one way services consume streams.

Each message is handled, then acked only after its side effect is committed. A handler that
raises an `EinsoraError` decides by `retryable`: `nak` with a back-off for a transient failure,
`term` for a poison message (recorded, never retried). Any other exception is logged with the
message and treated as transient, up to `max_deliver` deliveries. A lost connection or a fetch
timeout never ends the loop; `stop()` does.

A consumer may also take each fetched batch at once (`batch_handler`: one store transaction for
many messages), all acked after it returns; when it raises, the batch is handled again one
message at a time with `handler`, so each message still gets its own ack, nak or term.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from einsora.common import logs
from einsora.common.bus import names
from einsora.common.errors import EinsoraError

log = logging.getLogger("einsora.bus.consumer")

Handler = Callable[[Msg], Awaitable[None]]
BatchHandler = Callable[[Sequence[Msg]], Awaitable[None]]


class DurableConsumer:
    """Runs `handler` over every message of `filter_subject` in `stream`, in order."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str,
        durable: str,
        filter_subject: str,
        handler: Handler,
        batch: int = 64,
        max_deliver: int = 20,
        backoff: Sequence[float] = (0.2, 1.0, 5.0),
        ack_wait: float = 30.0,
        max_ack_pending: int = 1000,
        fetch_wait_s: float = 0.5,
        batch_handler: BatchHandler | None = None,
    ) -> None:
        self._js = js
        self._stream = stream
        self._durable = durable
        self._filter = filter_subject
        self._handler = handler
        self._batch_handler = batch_handler
        self._batch = batch
        self._backoff = list(backoff)
        self._fetch_wait_s = fetch_wait_s
        self._config = ConsumerConfig(
            durable_name=durable,
            filter_subject=filter_subject,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_deliver=max_deliver,
            ack_wait=ack_wait,
            max_ack_pending=max_ack_pending,
        )
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Declare the consumer (create or update) and start consuming."""
        await self._js.add_consumer(self._stream, self._config)
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

    async def _run(self) -> None:
        sub = None
        me = asyncio.current_task()
        while not self._stopping.is_set():
            if me is not None and me.cancelling():
                # nats-py turns a cancelled fetch into a timeout; do not loop on after cancel().
                raise asyncio.CancelledError
            try:
                if sub is None:
                    sub = await self._js.pull_subscribe_bind(
                        durable=self._durable, stream=self._stream
                    )
                msgs = await sub.fetch(self._batch, timeout=self._fetch_wait_s)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except (nats.errors.Error, OSError) as exc:
                # Disconnected or the server is restarting: wait for the client to reconnect.
                log.warning(
                    "fetch failed; retrying", extra={"consumer": self._durable, "error": repr(exc)}
                )
                await asyncio.sleep(0.5)
                continue
            if self._batch_handler is not None and len(msgs) > 1:
                await self._handle_batch(self._batch_handler, msgs)
                continue
            for msg in msgs:
                await self._handle(msg)

    async def _handle_batch(self, batch_handler: BatchHandler, msgs: Sequence[Msg]) -> None:
        try:
            await batch_handler(msgs)
        except Exception as exc:
            # Handlers are idempotent, so what the batch did commit is skipped the second time.
            log.warning(
                "batch failed; handling its messages one by one",
                extra={"consumer": self._durable, "size": len(msgs), "error": repr(exc)},
            )
            for msg in msgs:
                await self._handle(msg)
            return
        for msg in msgs:
            await _quietly(msg.ack())

    async def _handle(self, msg: Msg) -> None:
        request_id = names.REQUEST_ID_HEADER
        with logs.bind(request_id=(msg.headers or {}).get(request_id), subject=msg.subject):
            deliveries = msg.metadata.num_delivered or 1
            try:
                await self._handler(msg)
            except EinsoraError as exc:
                if exc.retryable:
                    await self._nak(msg, deliveries, exc)
                else:
                    log.error(
                        "message refused for good",
                        extra={"consumer": self._durable, "code": exc.code, "error": exc.message},
                    )
                    await _quietly(msg.term())
                return
            except Exception as exc:
                log.exception("handler failed", extra={"consumer": self._durable})
                await self._nak(msg, deliveries, exc)
                return
            await _quietly(msg.ack())

    async def _nak(self, msg: Msg, deliveries: int, exc: Exception) -> None:
        delay = self._backoff[min(deliveries, len(self._backoff)) - 1]
        log.warning(
            "message will be retried",
            extra={"consumer": self._durable, "delay_s": delay, "error": repr(exc)},
        )
        await _quietly(msg.nak(delay=delay))


async def _quietly(ack: Awaitable[None]) -> None:
    """An ack lost with the connection is redelivered later; consumers are idempotent."""
    with contextlib.suppress(nats.errors.Error, OSError):
        await ack
