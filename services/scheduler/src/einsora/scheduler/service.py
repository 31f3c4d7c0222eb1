"""`SchedulerService`: one region's scheduler, in the shape every Einsora service has.

`start()` connects, provisions the bus, migrates the store and takes the region's leader lease
(lease.py, ADR-0021). As the leader it rebuilds the book from the store, reads the whole
`machines` bucket (rewriting any desired state that lags the store, republishing any event the
store has not seen acknowledged, deleting stale routes), and only then starts consuming its
region's intents; it returns once it serves. When another scheduler holds the lease, it returns
as a standby, and takes over (doing all of that) once the leader's lease lapses or is released;
a leader deposed by another goes back to standing by. `stop()` undoes it, releasing the lease so
a standby takes over at once, and may be called twice.

A deposed leader (its heartbeat refused, or a commit the store refused) stops its engine and its
KV audit first, before anything else, and keeps its old term in the store's fence, so it
commits and writes nothing more (issue 35, F1). A standby never gives up: an error while it
waits for the lease or takes it over is logged and tried again (F2).

The region is its one parameter of place (`settings.region`, `einsora scheduler --region`):
it consumes only `intent.<region>.>`, owns only its region's machines, and, while it leads,
says it is alive in `regions/<region>` (ADR-0022), which other regions read before a region
step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from einsora.common import startup, telemetry
from einsora.common.bus import (
    DurableConsumer,
    close_quietly,
    connect_as,
    identities,
    names,
    provision,
    request_id_of,
    tls_trusting,
    traceparent_of,
)
from einsora.common.bus.mirror import KvMirror
from einsora.common.catalog import Catalog
from einsora.common.errors import ConfigError, EinsoraError
from einsora.common.metrics import MetricsServer, serve
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import WorkloadIntent, utcnow, what_is_wrong
from einsora.common.settings import Settings
from einsora.common.targets import OwnPorts
from einsora.common.transient import is_transient
from einsora.scheduler.beacon import PERIOD_S as BEACON_PERIOD_S
from einsora.scheduler.beacon import RegionBeacon
from einsora.scheduler.engine import CycleFailed, Engine, Timing
from einsora.scheduler.handoffs import HandoffSender
from einsora.scheduler.lease import RegionLease, holder_id
from einsora.scheduler.metrics import SchedulerMetrics
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
        beacon_s: float = BEACON_PERIOD_S,
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
        self.catalog = catalog or Catalog.load(settings.catalog)
        self.timing = Timing(suspect_after_s, lost_after_s, tick_s)
        self._audit_s = audit_s
        self._batch = batch
        self._ack_wait_s = ack_wait_s
        self._publish_timeout_s = publish_timeout_s
        self._clock = clock
        """The wall clock reclaims and fallback timers are judged by (a test's own, to pass a
        grace or a `fallback_after_s` at once)."""
        self._beacon_s = beacon_s
        self._beacon: RegionBeacon | None = None
        self._regions: KvMirror | None = None
        self._nc: NATS | None = None
        self._store: SchedulerStore | None = None
        self._engine: Engine | None = None
        self._watch: MachinesWatch | None = None
        self._usage: KvMirror | None = None
        self._enrolments: KvMirror | None = None
        self._consumer: DurableConsumer | None = None
        self._js: JetStreamContext | None = None
        self._lease: RegionLease | None = None
        self._standby: asyncio.Task[None] | None = None
        self._stepping_down: asyncio.Task[None] | None = None
        self._deposing = False
        self.metrics = SchedulerMetrics(self.region, lambda: self.engine.book)
        self._metrics_server: MetricsServer | None = None
        self._stopping = False
        self.leading = asyncio.Event()
        """Set while this scheduler leads its region (after `start()` or a takeover)."""

    @property
    def metrics_port(self) -> int | None:
        """Where /metrics listens once started, when `scheduler_metrics_port` is set."""
        return None if self._metrics_server is None else self._metrics_server.port

    @property
    def term(self) -> int:
        """The lease term this scheduler leads in (0: it does not lead)."""
        return self._lease.term if self._lease is not None else 0

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
        # NATS away, or its JetStream not answering yet, is waited out (issue 35, F5).
        self._nc = await startup.retrying(
            "connecting to NATS",
            lambda: connect_as(
                self.settings.effective_nats_url,
                identities.SCHEDULER,
                self.settings.nats_credentials_dir,
                name=f"einsora-scheduler-{self.region}",
                tls=tls_trusting(self.settings.nats_tls_cert),
            ),
            service=self.name,
        )
        js = self._js = self._nc.jetstream()
        await startup.retrying(
            "provisioning the bus",
            lambda: provision(js, replicas=self.settings.nats_replicas),
            service=self.name,
        )
        self._store = SchedulerStore(
            self.settings.effective_database_url, lease_s=self.settings.scheduler_lease_s
        )
        await self._store.migrate()
        self._metrics_server = serve(
            self.metrics.registry,
            host=self.settings.metrics_host,
            port=self.settings.scheduler_metrics_port,
            service="scheduler",
            setting="EINSORA_SCHEDULER_METRICS_PORT",
        )
        self._lease = RegionLease(
            js,
            self._store,
            region=self.region,
            holder=holder_id(self.settings.data_dir, self.region),
            lease_s=self.settings.scheduler_lease_s,
        )
        if await self._lease.try_acquire():
            await self._lead()
        else:
            log.info("standing by: another scheduler leads the region", extra=self._where())
            self._standby = asyncio.create_task(self._stand_by(), name="scheduler standby")

    def _where(self) -> dict[str, object]:
        return {"region": self.region, "holder": self._lease.holder if self._lease else None}

    async def _stand_by(self) -> None:
        """Wait for the lease, then lead. Whatever fails meanwhile (the bus or the store away,
        a takeover's start) is logged and tried again: a standby never ends but in `stop()`."""
        lease = self._lease
        assert lease is not None
        while True:
            raise_if_cancelled()
            try:
                await lease.acquire()
            except Exception as exc:
                raise_if_cancelled()
                if is_transient(exc):
                    log.warning(
                        "waiting for the lease failed; trying again",
                        extra={**self._where(), "error": repr(exc)},
                    )
                else:
                    log.exception("waiting for the lease failed; trying again", extra=self._where())
                await asyncio.sleep(lease.renew_s)
                continue
            try:
                await self._lead()
            except Exception:
                log.exception("taking over failed; standing by again", extra=self._where())
                await self._unlead()
                await lease.release()
                await asyncio.sleep(self.settings.scheduler_lease_s)
                continue
            log.info("took over the region", extra={**self._where(), "term": self.term})
            return

    async def _deposed(self) -> None:
        """Another scheduler took the lease: stop deciding and writing at once, then the rest,
        and stand by again. The engine halts and the KV audit stops before anything else; the
        store's fence keeps the old term throughout (fail closed: lease.py)."""
        if self._deposing:
            return
        self._deposing = True
        try:
            engine = self._engine
            if engine is not None:
                engine.halt()  # no await before this: no cycle runs once we know
            watch, self._watch = self._watch, None
            if watch is not None:
                await watch.stop()
            if self._lease is not None:
                self._lease.stand_down()
            await self._unlead(deposed=True)
        finally:
            self._deposing = False
        standby = self._standby
        if not self._stopping and (standby is None or standby.done()):
            # (A takeover still starting in the standby task fails on its own, and waits again.)
            self._standby = asyncio.create_task(self._stand_by(), name="scheduler standby")

    def _engine_deposed(self) -> None:
        """The store refused the engine's commit: another scheduler leads (news the lease's
        heartbeat may not have brought yet, after a stall)."""
        log.warning("deposed: another scheduler leads the region now", extra=self._where())
        if self._stepping_down is None or self._stepping_down.done():
            self._stepping_down = asyncio.create_task(self._deposed(), name="scheduler steps down")

    async def _lead(self) -> None:
        """Everything a leader runs, from the book's load to consuming intents."""
        assert self._nc is not None
        assert self._js is not None
        assert self._store is not None
        assert self._lease is not None
        js = self._js
        # Renewed from now on: loading a large book must not let the lease lapse.
        self._lease.keep(self._deposed)
        await self._store.forget_old_intents()
        routes = await js.key_value(names.ROUTES.name)
        projector = Projector(
            self._nc,
            js,
            publish_timeout_s=self._publish_timeout_s,
            registry=self.metrics.registry,
        )
        if self.settings.nats_replicas == 1:
            # Each desired-state write is fenced on the lease's term key.
            projector.fence = self._lease.fence
            self._lease.on_fence = lambda fence: setattr(projector, "fence", fence)
        else:
            # A clustered stream refuses a second check on one subject while one is in flight
            # (JetStream's error 10164), which would serialise every write behind the term key:
            # there each desired write is fenced on its own key (projection.py, ADR-0021).
            projector.per_key = True
        projector.on_desired_written = self.metrics.desired_written
        engine = Engine(
            self.region,
            self.catalog,
            self._store,
            projector,
            self.timing,
            tokens=WorkloadTokens.from_file(
                self.settings.scheduler_tokens_key or self.settings.data_dir / TOKENS_KEY_FILE
            ),
            owner_tenant=self.settings.machine_owner_tenant,
            community_pool=self.settings.community_pool,
            sim_machines=self.settings.sim_machines,
            clock=self._clock,
            handoffs=HandoffSender(js, publish_timeout_s=self._publish_timeout_s),
        )
        engine.hooks = self.metrics
        engine.own_ports = OwnPorts.of(self.settings)  # no route reaches them (ADR-0026)
        engine.on_deposed = self._engine_deposed
        engine.watched_until = self._lease.previous_beat_at  # a takeover times silence (F7)
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
            replicas=self.settings.nats_replicas,
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
        # The other regions' schedulers: a region step goes only to one that is up.
        self._regions = KvMirror(
            self._nc,
            js,
            names.REGIONS,
            on_put=engine.submit_region,
            on_delete=lambda key: engine.submit_region(key, None),
            audit_s=60.0,
        )
        await self._regions.start()
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
            registry=self.metrics.registry,
        )
        await self._consumer.start()
        self._beacon = RegionBeacon(js, lambda: engine.book, period_s=self._beacon_s)
        await self._beacon.beat()
        self._beacon.start()
        if engine.halted or self._engine is not engine:
            raise CycleFailed("deposed while taking over")
        self.metrics.lease(leader=True, term=self._lease.term)
        self.leading.set()
        log.info("scheduler ready", extra={"region": self.region, "term": self._lease.term})

    async def stop(self) -> None:
        self._stopping = True
        for task in (self._stepping_down, self._standby):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._stepping_down = self._standby = None
        await self._unlead()
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.release()
        server, self._metrics_server = self._metrics_server, None
        if server is not None:
            server.stop()
        store, self._store = self._store, None
        if store is not None:
            await store.close()
        nc, self._nc = self._nc, None
        # Every ack this service waits for has come or failed by now: nothing to drain.
        await close_quietly(nc)

    async def _unlead(self, *, deposed: bool = False) -> None:
        """Stop what a leader runs (the connection, store and lease stay)."""
        self.leading.clear()
        self.metrics.lease(leader=False, term=self.term)
        beacon, self._beacon = self._beacon, None
        if beacon is not None:
            await beacon.stop(say_stopped=not deposed)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.stop()
        for mirror in (self._usage, self._enrolments, self._regions):
            if mirror is not None:
                await mirror.stop()
        self._usage = self._enrolments = self._regions = None
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.stop()

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
        if telemetry.ON:
            self.engine.tracing.remember(intent.intent_id, traceparent_of(msg.headers))
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
