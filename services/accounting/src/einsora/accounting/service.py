"""`AccountingService`: metering, token usage, reports and per-tenant usage, as one service.

`start()` connects as the `accounting` bus identity, provisions the `usage` bucket (the only
stream it owns), migrates its store, serves `/metrics` when a port is set, starts publishing
each tenant's usage to KV, waits for the EVENTS and USAGE streams (the api provisions them),
then consumes workload events (`accounting-events`) and token counts (`accounting-tokens`)
through durable consumers, a fetched batch in one transaction, and answers `accounting.report`
in its queue group. It returns once it serves; `stop()` undoes it and may be called twice.
Each start-up step that talks to NATS waits out a transient failure (NATS away, a stream
without a leader yet) rather than ending the start (`einsora.common.startup`).

A SIGKILL at any instant is safe: an event's effect and its id commit together, and what was
fetched but not acknowledged is delivered again and recognised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import ValidationError
from sqlalchemy.exc import DataError, SQLAlchemyError

from einsora.accounting.intake import BadMessage, event_of, token_usage_of
from einsora.accounting.metrics import AccountingMetrics
from einsora.accounting.publisher import DEBOUNCE_S, PERIOD_S, UsagePublisher
from einsora.accounting.reports import fitted
from einsora.accounting.store import AccountingStore
from einsora.common import startup
from einsora.common.bus import (
    DurableConsumer,
    bind_bucket,
    close_quietly,
    connect_as,
    identities,
    names,
    provision,
    tls_trusting,
)
from einsora.common.errors import ConfigError, EinsoraError
from einsora.common.metrics import MetricsServer, serve
from einsora.common.schemas import (
    EventKind,
    UsageReportReply,
    UsageReportRequest,
    utcnow,
    what_is_wrong,
)
from einsora.common.settings import Settings
from einsora.common.transient import is_transient

log = logging.getLogger("einsora.accounting")

EVENTS_CONSUMER = "accounting-events"
TOKENS_CONSUMER = "accounting-tokens"
TOKENS_FILTER = names.USAGE.subjects[0]
"""`usage.tokens.*`: the gateway's counts (the stream's other subjects are accounting's own)."""
REPORTS_IN_FLIGHT = 8
"""Reports computed at once (SQLite reads them on four threads; Postgres on its pool)."""


class AccountingService:
    """Meters allocations from workload events, records token usage, answers usage reports
    and publishes each tenant's recent usage."""

    name = "accounting"

    def __init__(
        self,
        settings: Settings,
        *,
        batch: int = 256,
        ack_wait_s: float = 30.0,
        publish_debounce_s: float = DEBOUNCE_S,
        publish_period_s: float = PERIOD_S,
        streams_wait_s: float = 60.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if batch < 1:
            raise ConfigError(f"the batch must be at least 1 message, not {batch}")
        self.settings = settings
        self.half_life_h = settings.fair_share_half_life_h
        self._batch = batch
        self._ack_wait_s = ack_wait_s
        self._debounce_s = publish_debounce_s
        self._period_s = publish_period_s
        self._streams_wait_s = streams_wait_s
        self.clock = clock
        self.metrics = AccountingMetrics()
        self._metrics_server: MetricsServer | None = None
        self._nc: NATS | None = None
        self._store: AccountingStore | None = None
        self._publisher: UsagePublisher | None = None
        self._consumers: list[DurableConsumer] = []
        self._reports: Subscription | None = None
        self._report_slots = asyncio.Semaphore(REPORTS_IN_FLIGHT)
        self._report_tasks: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> AccountingStore:
        """The running store (for tests and diagnostics); only after `start()`."""
        assert self._store is not None, "accounting is not started"
        return self._store

    @property
    def publisher(self) -> UsagePublisher:
        assert self._publisher is not None, "accounting is not started"
        return self._publisher

    @property
    def metrics_port(self) -> int | None:
        """Where /metrics listens once started, when `accounting_metrics_port` is set."""
        return None if self._metrics_server is None else self._metrics_server.port

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        # Each first call to the bus waits out a transient failure (issue 35, F5: a `nats:
        # timeout` in provision, a NATS node lost meanwhile, once ended the start).
        self._nc = await startup.retrying(
            "connecting to NATS",
            lambda: connect_as(
                self.settings.effective_nats_url,
                identities.ACCOUNTING,
                self.settings.nats_credentials_dir,
                name="einsora-accounting",
                tls=tls_trusting(self.settings.nats_tls_cert),
            ),
            service=self.name,
        )
        js = self._nc.jetstream()
        await startup.retrying(
            "provisioning the usage bucket",
            lambda: provision(
                js, replicas=self.settings.nats_replicas, only=(names.USAGE_KV.stream,)
            ),
            service=self.name,
        )
        self._store = AccountingStore(self.settings.effective_database_url)
        await self._store.migrate()
        await self._store.forget_old_events()
        rebuilt = await self._store.rebuild_decay(self.half_life_h, self.clock())
        if rebuilt:
            log.info(
                "decayed usage recomputed for a new half-life",
                extra={"tenants": rebuilt, "half_life_h": self.half_life_h},
            )
        self.metrics.allocations_open.set(await self._store.count_open())
        self._metrics_server = serve(
            self.metrics.registry,
            host=self.settings.metrics_host,
            port=self.settings.accounting_metrics_port,
            service="accounting",
            setting="EINSORA_ACCOUNTING_METRICS_PORT",
        )
        self._publisher = UsagePublisher(
            self._store,
            bind_bucket(js, names.USAGE_KV),
            half_life_h=self.half_life_h,
            clock=self._now,
            debounce_s=self._debounce_s,
            period_s=self._period_s,
        )
        self._publisher.start()
        self._reports = await self._nc.subscribe(
            names.ACCOUNTING_REPORT_SUBJECT,
            queue=names.ACCOUNTING_QUEUE_GROUP,
            cb=self._on_report,
        )
        await self._wait_for_streams(js)
        for consumer in (
            DurableConsumer(
                js,
                stream=names.EVENTS.name,
                durable=EVENTS_CONSUMER,
                filter_subject=names.EVENTS_FILTER,
                handler=self._on_event,
                batch_handler=self._on_events,
                batch=self._batch,
                ack_wait=self._ack_wait_s,
                registry=self.metrics.registry,
            ),
            DurableConsumer(
                js,
                stream=names.USAGE.name,
                durable=TOKENS_CONSUMER,
                filter_subject=TOKENS_FILTER,
                handler=self._on_tokens_one,
                batch_handler=self._on_tokens,
                batch=self._batch,
                ack_wait=self._ack_wait_s,
                registry=self.metrics.registry,
            ),
        ):
            await startup.retrying("declaring its consumers", consumer.start, service=self.name)
            self._consumers.append(consumer)
        log.info("accounting ready", extra={"half_life_h": self.half_life_h})

    def _now(self) -> datetime:
        # Looked up at each call, so a test can swap `clock` on a running service.
        return self.clock()

    async def _wait_for_streams(self, js: JetStreamContext) -> None:
        """EVENTS and USAGE are the api's to provision; wait a while for them (services of
        a cell may start in any order), then say what is missing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._streams_wait_s
        reported = False
        while True:
            missing = []
            for stream in (names.EVENTS.name, names.USAGE.name):
                try:
                    # A stream that does not answer yet is waited for here; one that is not
                    # there is the api's to make, and waited for below.
                    await startup.retrying(
                        f"reading the {stream} stream",
                        partial(js.stream_info, stream),
                        service=self.name,
                    )
                except NotFoundError:
                    missing.append(stream)
            if not missing:
                return
            if loop.time() >= deadline:
                raise ConfigError(
                    f"the bus has no {' or '.join(missing)} stream: start the api (which "
                    "provisions the bus) before accounting, or against the same NATS"
                )
            if not reported:
                log.warning("waiting for streams the api provisions", extra={"missing": missing})
                reported = True
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        consumers, self._consumers = self._consumers, []
        # Each waits out its fetch in flight; together, not one after the other.
        await asyncio.gather(*(c.stop() for c in consumers))
        reports, self._reports = self._reports, None
        if reports is not None:
            with contextlib.suppress(Exception):
                await reports.unsubscribe()
        if self._report_tasks:
            await asyncio.gather(*self._report_tasks, return_exceptions=True)
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            await publisher.stop()
        server, self._metrics_server = self._metrics_server, None
        if server is not None:
            await asyncio.to_thread(server.stop)
        store, self._store = self._store, None
        if store is not None:
            await store.close()
        nc, self._nc = self._nc, None
        await close_quietly(nc)

    # --- workload events --------------------------------------------------------------------

    async def _on_event(self, msg: Msg) -> None:
        await self._on_events([msg])

    async def _on_events(self, msgs: Sequence[Msg]) -> None:
        events = [event_of(m) for m in msgs]
        if not any(e.kind is EventKind.transition for e in events):
            return  # notes only: nothing to meter, nothing to write
        store = self.store
        try:
            applied = await store.apply_events(events, self.half_life_h)
        except SQLAlchemyError as exc:
            raise EinsoraError(f"store unavailable: {exc!r}", retryable=True) from exc
        self.metrics.took(applied)
        if applied.tenants:
            self.publisher.changed(applied.tenants)

    # --- token usage ------------------------------------------------------------------------

    async def _on_tokens_one(self, msg: Msg) -> None:
        await self._on_tokens([msg])

    async def _on_tokens(self, msgs: Sequence[Msg]) -> None:
        usages = [token_usage_of(m) for m in msgs]
        try:
            await self.store.add_token_usage(usages)
        except (DataError, OverflowError) as exc:
            # A number the store cannot hold is the message's fault, not the store's: retried,
            # it would fail the same way for ever. (A batch is then taken one by one, and only
            # the message at fault is terminated.)
            raise BadMessage(f"a count the store cannot hold ({type(exc).__name__})") from exc
        except SQLAlchemyError as exc:
            raise EinsoraError(f"store unavailable: {exc!r}", retryable=True) from exc

    # --- reports ----------------------------------------------------------------------------

    async def _on_report(self, msg: Msg) -> None:
        # The subscription hands messages over one at a time; each report runs in a task of
        # its own so a long one does not hold up the next.
        task = asyncio.create_task(self._answer(msg))
        self._report_tasks.add(task)
        task.add_done_callback(self._report_tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        async with self._report_slots:
            reply = await self._report(msg.data)
        nc = self._nc
        if not msg.reply or nc is None:
            return
        try:
            await msg.respond(fitted(reply, nc.max_payload))
        except Exception as exc:
            # The asker times out and may ask again; nothing here is lost.
            log.warning("usage report not answered", extra={"error": repr(exc)})

    async def _report(self, data: bytes) -> UsageReportReply:
        try:
            request = UsageReportRequest.from_bytes(data)
        except ValidationError as exc:
            return UsageReportReply(error=f"not a usage report request: {what_is_wrong(exc)}")
        store = self._store
        if store is None:
            return UsageReportReply(error="accounting is stopping; ask again")
        try:
            return await store.report(request)
        except Exception as exc:
            if is_transient(exc):  # the store away: a connection refused, lost or timed out
                log.warning("usage report failed; the store is away", extra={"error": repr(exc)})
                return UsageReportReply(
                    error="accounting's store is unavailable; try again shortly"
                )
            log.exception("usage report failed")
            return UsageReportReply(error="accounting could not make this report (see its log)")
