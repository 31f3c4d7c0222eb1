"""`SchedulerService`: one region's scheduler, in the shape every Einsora service has.

`start()` connects, provisions the bus, migrates the store, rebuilds the book from the store,
reads the whole `machines` bucket (rewriting any desired state that lags the store, republishing
any event the store has not seen acknowledged, deleting stale routes), and only then starts
consuming its region's intents. It returns once it serves; `stop()` undoes it and may be called
twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from einsora.common.bus import (
    DurableConsumer,
    connect_as,
    identities,
    names,
    provision,
    request_id_of,
    tls_trusting,
)
from einsora.common.bus.mirror import KvMirror
from einsora.common.catalog import Catalog
from einsora.common.errors import ConfigError, EinsoraError
from einsora.common.schemas import WorkloadIntent, utcnow, what_is_wrong
from einsora.common.settings import Settings
from einsora.scheduler.engine import CycleFailed, Engine, Timing
from einsora.scheduler.projection import Projector
from einsora.scheduler.store import SchedulerStore
from einsora.scheduler.tokens import KEY_FILE as TOKENS_KEY_FILE
from einsora.scheduler.tokens import WorkloadTokens
from einsora.scheduler.watch import MachineKey, MachinesWatch

log = logging.getLogger("einsora.scheduler")


class BadIntent(EinsoraError):
    """An intent that can never be handled: unreadable, or not where its subject says."""

    code = "bad_intent"
    retryable = False


class SchedulerService:
    """Admission, placement, queue and reconcile for the region `settings.region`."""

    name = "scheduler"

    def __init__(
        self,
        settings: Settings,
        *,
        catalog: Catalog | None = None,
        suspect_after_s: float = 30.0,
        lost_after_s: float = 120.0,
        tick_s: float = 1.0,
        audit_s: float = 2.0,
        batch: int = 256,
        ack_wait_s: float = 30.0,
        publish_timeout_s: float = 5.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        try:
            names.intent_region_filter(settings.region)
        except ValueError as exc:
            raise ConfigError(
                f"region {settings.region!r} is not valid: use letters, digits, '-' or '_'"
            ) from exc
        if not 0 < suspect_after_s < lost_after_s:
            raise ConfigError(
                "a machine must be suspect before it is lost: need 0 < suspect_after_s "
                f"({suspect_after_s:g}) < lost_after_s ({lost_after_s:g})"
            )
        self.settings = settings
        self.region = settings.region
        self.catalog = catalog or Catalog.load()
        self.timing = Timing(suspect_after_s, lost_after_s, tick_s)
        self._audit_s = audit_s
        self._batch = batch
        self._ack_wait_s = ack_wait_s
        self._publish_timeout_s = publish_timeout_s
        self._clock = clock
        """The wall clock reclaims are judged by (a test's own, to pass a grace at once)."""
        self._nc: NATS | None = None
        self._store: SchedulerStore | None = None
        self._engine: Engine | None = None
        self._watch: MachinesWatch | None = None
        self._usage: KvMirror | None = None
        self._enrolments: KvMirror | None = None
        self._consumer: DurableConsumer | None = None

    @property
    def engine(self) -> Engine:
        """The running engine (for tests and Solo's diagnostics); only after `start()`."""
        assert self._engine is not None, "the scheduler is not started"
        return self._engine

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self._nc = await connect_as(
            self.settings.effective_nats_url,
            identities.SCHEDULER,
            self.settings.nats_credentials_dir,
            name=f"einsora-scheduler-{self.region}",
            tls=tls_trusting(self.settings.nats_tls_cert),
        )
        js = self._nc.jetstream()
        await provision(js)
        self._store = SchedulerStore(self.settings.effective_database_url)
        await self._store.migrate()
        await self._store.forget_old_intents()
        routes = await js.key_value(names.ROUTES.name)
        projector = Projector(js, publish_timeout_s=self._publish_timeout_s)
        engine = Engine(
            self.region,
            self.catalog,
            self._store,
            projector,
            self.timing,
            tokens=WorkloadTokens.from_file(self.settings.data_dir / TOKENS_KEY_FILE),
            owner_tenant=self.settings.machine_owner_tenant,
            community_pool=self.settings.community_pool,
            clock=self._clock,
        )
        self._engine = engine
        await engine.load()
        engine.start()
        # Enrolments first: the machines' snapshot that follows counts only enrolled machines.
        self._enrolments = KvMirror(
            self._nc,
            js,
            names.ENROLMENTS,
            on_put=engine.submit_enrolment,
            on_delete=lambda key: engine.submit_enrolment(key, None),
            audit_s=60.0,
        )
        await self._enrolments.start()
        self._watch = MachinesWatch(
            self._nc,
            js,
            on_snapshot=self._on_snapshot,
            on_key=engine.submit_key,
            on_present=engine.submit_present,
            audit_s=self._audit_s,
        )
        await self._watch.start()
        # Quotas (api) and recent use (accounting): admission never passes a tenant's quota.
        self._usage = KvMirror(
            self._nc,
            js,
            names.USAGE_KV,
            on_put=engine.submit_usage,
            on_delete=lambda key: engine.submit_usage(key, None),
            audit_s=60.0,
        )
        await self._usage.start()
        await engine.clean_routes(await _route_keys(js, routes))
        self._consumer = DurableConsumer(
            js,
            stream=names.INTENTS.name,
            durable=f"scheduler-{self.region}",
            filter_subject=names.intent_region_filter(self.region),
            handler=self._on_intent,
            batch_handler=self._on_intents,
            batch=self._batch,
            ack_wait=self._ack_wait_s,
        )
        await self._consumer.start()
        log.info("scheduler ready", extra={"region": self.region})

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.stop()
        for mirror in (self._usage, self._enrolments):
            if mirror is not None:
                await mirror.stop()
        self._usage = self._enrolments = None
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.stop()
        store, self._store = self._store, None
        if store is not None:
            await store.close()
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            # Every ack this service waits for has come or failed by now: nothing to drain.
            await nc.close()

    async def _on_snapshot(self, keys: list[MachineKey]) -> None:
        """A snapshot must be applied; a bus hiccup while projecting it is retried."""
        assert self._engine is not None
        for attempt in range(10):
            try:
                await self._engine.submit_snapshot(keys)
                return
            except CycleFailed:
                if attempt == 9:
                    raise
                await asyncio.sleep(0.5)

    async def _on_intent(self, msg: Msg) -> None:
        await self._on_intents([msg])

    async def _on_intents(self, msgs: Sequence[Msg]) -> None:
        assert self._engine is not None
        await self._engine.submit_intents([self._parse(m) for m in msgs])

    def _parse(self, msg: Msg) -> tuple[WorkloadIntent, str | None]:
        try:
            intent = WorkloadIntent.from_bytes(msg.data)
        except ValidationError as exc:
            raise BadIntent(f"unreadable intent on {msg.subject}: {what_is_wrong(exc)}") from exc
        try:
            expected = names.intent_subject(intent.region, intent.workload_id)
        except ValueError:
            expected = None
        if msg.subject != expected:
            raise BadIntent(
                f"intent for workload {intent.workload_id!r} in region {intent.region!r} came "
                f"on {msg.subject}; it is refused"
            )
        return intent, request_id_of(msg.headers)


async def _route_keys(js: JetStreamContext, routes: KeyValue) -> list[str]:
    """Every key of the routes bucket.

    nats-py's `keys()` can answer "no keys" when the keys arrive faster than it counts them;
    that answer is trusted only when the bucket's stream is empty.
    """
    for _ in range(5):
        try:
            return list(await routes.keys())
        except NoKeysError:
            info = await js.stream_info(names.ROUTES.stream)
            if info.state.messages == 0:
                return []
    return []
