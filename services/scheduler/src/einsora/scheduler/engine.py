"""The engine: one loop that owns the book, and the order in which its decisions leave it.

Inputs (batches of intents, keys of the `machines` bucket, liveness ticks) wait in one queue.
Each cycle takes everything waiting, decides, and then, in this order (ADR-0004):
1. commits every decision of the cycle to the store in one transaction;
2. writes each affected machine's complete desired state once;
3. once those are stored, publishes the cycle's events (`Nats-Msg-Id` = `<workload>-<seq>`)
   and writes its routes, together;
The cycle's intents are acked once step 1 is done: the store then holds every decision, and
the projection is the store's to finish (a failed one is retried by the next, and start-up
rewrites whatever the store has that the bus may lack). Steps 2-3 of one cycle overlap the
next batch's fetch, decisions and commit: the projection is serialised at the commit, so it
never carries a decision the store lacks, and projections go on the wire one after another;
at most `PIPELINE` are in flight. A crash between any two steps is harmless: an intent not yet
acked comes back and is recognised by its id.

A commit the store refuses because the region's lease moved on (`Deposed`) ends the engine at
once (issue 35, F1): it neither rebuilds its book nor projects anything again, and the service
stands by. Machines' silence is timed from their last heartbeat the bus recorded, across a
takeover and a reload (F7; observe.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from einsora.common import logs
from einsora.common.catalog import Catalog
from einsora.common.errors import EinsoraError
from einsora.common.schemas import (
    Enrolment,
    WorkloadIntent,
    WorkloadState,
    utcnow,
    what_is_wrong,
)
from einsora.common.targets import OwnPorts
from einsora.scheduler import chain, regions
from einsora.scheduler.admission import admit_queued
from einsora.scheduler.book import Book
from einsora.scheduler.handoffs import HandoffSender
from einsora.scheduler.hooks import EngineHooks
from einsora.scheduler.intents import apply_intent
from einsora.scheduler.machines import MachineReader
from einsora.scheduler.model import Liveness
from einsora.scheduler.observe import check_liveness, silence_from_the_bus
from einsora.scheduler.projection import Projection, Projector
from einsora.scheduler.quotas import apply_usage_key
from einsora.scheduler.reclaim import check_reclaim
from einsora.scheduler.store import Deposed, SchedulerStore, Snapshot
from einsora.scheduler.tokens import WorkloadTokens
from einsora.scheduler.tracing import SchedulerTracing
from einsora.scheduler.watch import MachineKey

log = logging.getLogger("einsora.scheduler.engine")

PIPELINE = 8
"""Projections that may be in flight while the next cycle decides: deep enough to hide the
acks' wait, shallow enough that a bus outage piles up little. Chosen with bench/admission.py
--direct on this 2-core machine, alternating in one sitting: 2 gave 1,615-1,626 admissions/s,
4 gave 1,827-2,162, 8 gave 1,946-2,053, 16 gave 1,978-2,230 (the fsynced acks of one projection
take longer than a cycle's decisions, so two in flight left the bus idle between them)."""


class CycleFailed(EinsoraError):
    """The cycle's decisions did not all reach the store and the bus yet; retry the intents."""

    code = "scheduler_busy"
    retryable = True


class IntentAhead(EinsoraError):
    """An intent came before its workload's create: delivered again later (intents.py)."""

    code = "intent_ahead_of_create"
    retryable = True


@dataclass
class _Intents:
    intents: list[tuple[WorkloadIntent, str | None]]
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass
class _Snapshot:
    keys: list[MachineKey]
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass
class _Tick:
    pass


@dataclass
class _Present:
    machine_ids: set[str]


@dataclass
class _Replay:
    """Machines' latest values applied again after a reload, judged by their own heartbeat."""

    keys: list[MachineKey]


@dataclass
class _UsageKey:
    """A key of the `usage` bucket: a tenant's quota or recent use (None: deleted)."""

    key: str
    value: bytes | None


@dataclass
class _EnrolmentKey:
    """A key of the `enrolments` bucket: a machine enrolled or revoked (None: deleted)."""

    machine_id: str
    value: bytes | None


@dataclass
class _RegionKey:
    """A key of the `regions` bucket: another region's scheduler (None: deleted)."""

    region: str
    value: bytes | None


_Input = (
    _Intents
    | _Snapshot
    | MachineKey
    | _Tick
    | _Present
    | _Replay
    | _UsageKey
    | _EnrolmentKey
    | _RegionKey
)


@dataclass(frozen=True)
class Timing:
    """How silence is judged and how often the engine looks."""

    suspect_after_s: float = 30.0
    lost_after_s: float = 120.0
    tick_s: float = 1.0


class Engine:
    """The single owner of the book."""

    def __init__(
        self,
        region: str,
        catalog: Catalog,
        store: SchedulerStore,
        projector: Projector,
        timing: Timing,
        *,
        max_inputs_per_cycle: int = 4096,
        tokens: WorkloadTokens | None = None,
        owner_tenant: str | None = None,
        community_pool: bool = False,
        sim_machines: bool = False,
        clock: Callable[[], datetime] = utcnow,
        handoffs: HandoffSender | None = None,
    ) -> None:
        self.region = region
        self.handoffs = handoffs
        self.clock = clock
        self.catalog = catalog
        self.store = store
        self.projector = projector
        self.timing = timing
        self.tokens = tokens or WorkloadTokens.ephemeral()
        self.owner_tenant = owner_tenant
        self.community_pool = community_pool
        self.sim_machines = sim_machines
        self.book = Book(
            region,
            catalog,
            self.tokens,
            owner_tenant=owner_tenant,
            community_pool=community_pool,
            sim_machines=sim_machines,
            clock=clock,
        )
        self._queue: asyncio.Queue[_Input] = asyncio.Queue()
        self._max_inputs = max_inputs_per_cycle
        self.reader = MachineReader(projector)
        self._failures = 0
        self._stale = False
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._projecting: list[asyncio.Task[None]] = []
        self._last_projection: Projection | None = None
        self._projection_failures = 0
        self._stored_regions: dict[str, str] = {}
        """This cycle's intents' workloads that the store knows but the book does not: the
        region that holds each (ADR-0022)."""
        self.tracing = SchedulerTracing()
        """Intents' trace contexts, and each decision's span (tracing.py)."""
        self.hooks = EngineHooks()
        """What the engine tells the metrics as it goes (hooks.py)."""
        self._ahead: set[str] = set()
        """Intents of the last cycles that came before their workload's create: their
        submitter hands them back to the bus (`IntentAhead`)."""
        self.own_ports = OwnPorts(frozenset())
        """The control plane's own ports, which no route reaches (the book's, on every load)."""
        self.on_deposed: Callable[[], None] | None = None
        """Told once when the store refused a commit because another scheduler leads now; the
        engine has stopped by then."""
        self.halted = False
        """Stopped for good (deposed, or stopped): it decides and writes nothing more."""
        self.watched_until: datetime | None = None
        """Until when the region's machines were judged before the first load: the previous
        leader's last heartbeat, as the bus stored it (lease.py). A gap shorter than
        `lost_after_s` is a takeover, and each machine's silence is timed from its last
        heartbeat the bus recorded; no previous leader, or a longer gap (the whole cell was
        down), gives every machine a grace period from the load (issue 35, F7)."""
        self._unseen: set[str] = set()
        """Machines whose grace from the load gives way to their last heartbeat on the bus."""

    # --- lifecycle --------------------------------------------------------------------------

    async def load(self, *, reloading: bool = False) -> None:
        """Rebuild the book from the store (at start, and after a failed commit)."""
        snapshot = await self.store.load(self.region)
        old = self.book
        self.book = _book_from(
            snapshot,
            self.region,
            self.catalog,
            time.monotonic(),
            self.tokens,
            self.owner_tenant,
            self.community_pool,
            self.clock,
            sim_machines=self.sim_machines,
        )
        # Quotas, usage and the other regions come from the bus, not the store: the mirrors do
        # not send them again.
        self.book.quotas, self.book.usage = old.quotas, old.usage
        self.book.own_ports = self.own_ports
        self.book.regions = old.regions
        if self.handoffs is not None:
            self.handoffs.load(snapshot.handoffs)
        self.reader.forget_reports()
        # What the bus said of each machine's enrolment (owner, guests, lend) holds for the
        # rebuilt book at once: no cycle may place on a lend or a sharing it forgot.
        now = time.monotonic()
        for machine_id, enrolment in list(self.reader.enrolments.items()):
            self.reader.apply_enrolment(self.book, machine_id, enrolment, now)
        self.projector.events = list(snapshot.outbox)
        self.projector.writing.clear()  # no projection is in flight at a (re)load
        self.projector.forget_writes()
        watched = self.watched_until
        self.reader.timed_by_bus = reloading or (
            watched is not None and (utcnow() - watched).total_seconds() < self.timing.lost_after_s
        )
        self._unseen = (
            {m.machine_id for m in self.book.machines.values() if m.liveness is not Liveness.lost}
            if self.reader.timed_by_bus
            else set()
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"scheduler engine {self.region}")
        self._ticker = asyncio.create_task(self._tick_loop(), name="scheduler ticks")

    async def stop(self) -> None:
        tasks = [t for t in (self._ticker, self._task, *self._projecting) if t is not None]
        self.halt()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def halt(self) -> None:
        """Stop at once, before the caller's next await: no cycle decides, commits or projects
        again; what waits on a cycle is told to retry (a deposed leader's first step)."""
        self.halted = True
        for task in (self._ticker, self._task, *self._projecting):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._task = self._ticker = None
        self._projecting = []
        stopped = CycleFailed("the scheduler stopped leading; another decides")
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, _Intents | _Snapshot):
                _fail([item.done], stopped)

    # --- inputs -----------------------------------------------------------------------------

    async def submit_intents(self, intents: list[tuple[WorkloadIntent, str | None]]) -> None:
        """Returns once the intents' decisions are in the store (their projection onto the bus
        follows, retried until it is written: the store has everything it needs)."""
        if self.halted:
            raise CycleFailed("the scheduler stopped leading; another decides")
        item = _Intents(intents)
        self._queue.put_nowait(item)
        await item.done
        ahead = {i.intent_id for i, _ in intents} & self._ahead
        if ahead:
            self._ahead -= ahead
            raise IntentAhead(
                f"{len(ahead)} intent(s) came before their workload's create; delivered again"
            )

    async def submit_snapshot(self, keys: list[MachineKey]) -> None:
        if self.halted:
            raise CycleFailed("the scheduler stopped leading; another decides")
        item = _Snapshot(keys)
        self._queue.put_nowait(item)
        await item.done

    def submit_key(self, key: MachineKey) -> None:
        self.reader.keep(key)
        self._queue.put_nowait(key)

    def submit_usage(self, key: str, value: bytes | None) -> None:
        """A tenant's quota or recent use changed (the `usage` bucket)."""
        self._queue.put_nowait(_UsageKey(key, value))

    def submit_enrolment(self, machine_id: str, value: bytes | None) -> None:
        """A machine's enrolment changed (the `enrolments` bucket)."""
        self._queue.put_nowait(_EnrolmentKey(machine_id, value))

    def submit_region(self, region: str, value: bytes | None) -> None:
        """Another region's scheduler said something (the `regions` bucket)."""
        self._queue.put_nowait(_RegionKey(region, value))

    def submit_present(self, machine_ids: set[str]) -> None:
        """The machines whose desired key exists in the bucket now (from the audit)."""
        self._queue.put_nowait(_Present(machine_ids))

    async def clean_routes(self, route_keys: list[str]) -> None:
        """Delete the routes of workloads of this scheduler that no longer run (at start)."""
        unknown = [k for k in route_keys if k not in self.book.workloads]
        stored = await self.store.states_of(unknown, self.region) if unknown else {}
        for key in route_keys:
            workload = self.book.workloads.get(key)
            if workload is not None and workload.region != self.region:
                continue  # handed over: its route is the other region's (ADR-0022)
            state = workload.state if workload is not None else stored.get(key)
            if state is not None and state is not WorkloadState.running:
                self.projector.routes.setdefault(key, None)
        self._queue.put_nowait(_Tick())

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.timing.tick_s)
            self._queue.put_nowait(_Tick())

    # --- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            items = [await self._queue.get()]
            while len(items) < self._max_inputs and not self._queue.empty():
                items.append(self._queue.get_nowait())
            intents = [i.done for i in items if isinstance(i, _Intents)]
            waiting = [i.done for i in items if isinstance(i, _Snapshot)]
            while len(self._projecting) >= PIPELINE:
                await asyncio.wait([self._projecting[0]])
            if self._projection_failures:
                # Back off while the bus is away, rather than spin.
                await asyncio.sleep(min(0.05 * 2**self._projection_failures, 2.0))
            started = time.perf_counter()
            try:
                projection = await self._cycle(items)
            except Deposed as exc:
                # Another scheduler leads: stop here, before anything else is decided or
                # written (no reload, no projection), and say so.
                log.warning(
                    "deposed: the store refused the commit; this scheduler stops deciding",
                    extra={"region": self.region, "error": str(exc)},
                )
                _fail(intents + waiting, exc)
                self.halt()
                if self.on_deposed is not None:
                    self.on_deposed()
                return
            except Exception as exc:
                self.hooks.cycled(time.perf_counter() - started, failed=True)
                self._failures += 1
                log.warning(
                    "cycle failed; its intents will be retried",
                    extra={"error": repr(exc), "failures": self._failures},
                )
                _fail(intents + waiting, exc)
                # Back off while the store or the bus is away, rather than spin.
                await asyncio.sleep(min(0.05 * 2**self._failures, 2.0))
                continue
            self._failures = 0
            self.hooks.cycled(time.perf_counter() - started, failed=False)
            # The store holds the cycle's decisions: its intents may be acked now, and the next
            # batch fetched and decided while this projection is on the wire (ADR-0004).
            _settle(intents)
            previous = self._projecting[-1] if self._projecting else None
            task = asyncio.create_task(
                self._project(projection, self._last_projection, previous, waiting),
                name="scheduler projection",
            )
            if projection is not None:
                self._last_projection = projection
            self._projecting.append(task)
            task.add_done_callback(self._projecting.remove)

    async def _project(
        self,
        projection: Projection | None,
        after: Projection | None,
        previous: asyncio.Task[None] | None,
        waiting: list[asyncio.Future[None]],
    ) -> None:
        """Write a cycle's projection, then settle what waits on it (a snapshot's reader) once
        it and every earlier one are written (an earlier failure is retried by a later
        projection, not by this one). The cycle's intents were acked at its commit."""
        try:
            if projection is not None:
                await self.projector.write(projection, after)
            if self.handoffs is not None:
                await self.handoffs.send()  # after the events that tell the hop (ADR-0022)
            if previous is not None:
                await asyncio.wait([previous])
        except Exception as exc:
            self._projection_failures += 1
            log.warning(
                "projection failed; a later one writes what it could not",
                extra={"error": repr(exc), "failures": self._projection_failures},
            )
            _fail(waiting, exc)
            return
        self._projection_failures = 0
        _settle(waiting)

    async def _cycle(self, items: list[_Input]) -> Projection | None:
        if self._stale:
            await self._reload()
        changes = self.book.begin()
        if self.handoffs is not None:
            self.handoffs.forget_sent(changes)
        intents = [pair for i in items if isinstance(i, _Intents) for pair in i.intents]
        try:
            fresh = await self._fresh(intents) if intents else []
            self._decide(items, fresh)
        except Exception:
            log.exception("deciding failed; the book is rebuilt from the store")
            self._stale = True
            self._requeue(items)
            raise
        # Outbox rows of published events are forgotten with the next decisions, or on a tick
        # when nothing else is decided: never a commit of their own per cycle.
        ticked = any(isinstance(i, _Tick) for i in items)
        published = list(self.projector.published)
        if not (changes.to_store or ticked or len(published) >= 4096):
            published = []
        if changes.to_store or published:
            try:
                await self.store.commit(changes, published)
            except Deposed:
                raise  # the engine ends: nothing of this book is ever written
            except Exception:
                log.exception("store commit failed; the book is rebuilt from the store")
                self._stale = True
                self._requeue(items)
                raise
            del self.projector.published[: len(published)]
        self.projector.take(changes)
        self._ahead |= changes.ahead
        if self.handoffs is not None:
            self.handoffs.take(changes)
        self.hooks.committed(changes)
        # No await between the commit and here: the projection holds committed decisions only.
        return self.projector.prepare(self.book)

    def _decide(self, items: list[_Input], fresh: list[tuple[WorkloadIntent, str | None]]) -> None:
        changes = self.book.changes
        now = time.monotonic()
        quota_moved = False
        for item in items:
            if isinstance(item, MachineKey):
                self.reader.apply(self.book, item, now, live=True)
            elif isinstance(item, _Snapshot):
                with silence_from_the_bus(self.book, self._unseen):
                    self.reader.apply_snapshot(self.book, item.keys, now)
            elif isinstance(item, _Tick):
                check_liveness(
                    self.book, now, self.timing.suspect_after_s, self.timing.lost_after_s
                )
                check_reclaim(self.book)
                chain.advance(self.book)
            elif isinstance(item, _Present):
                self.reader.rewrite_missing(self.book, item.machine_ids)
            elif isinstance(item, _Replay):
                with silence_from_the_bus(self.book, self._unseen):
                    for key in item.keys:
                        self.reader.apply(self.book, key, now, live=False)
            elif isinstance(item, _UsageKey):
                quota_moved |= apply_usage_key(self.book, item.key, item.value)
            elif isinstance(item, _EnrolmentKey):
                self.reader.apply_enrolment(
                    self.book, item.machine_id, _enrolment(item.machine_id, item.value), now
                )
            elif isinstance(item, _RegionKey) and regions.apply_status(
                self.book, item.region, item.value
            ):
                chain.region_up(self.book, item.region)
        trace = self.tracing
        for intent, request_id in fresh:
            with (
                logs.bind(request_id=request_id, tenant=intent.tenant_id),
                trace.decision(self.book, intent, request_id),
            ):
                stored_region = self._stored_regions.get(intent.workload_id)
                apply_intent(self.book, intent, request_id, stored_region=stored_region)
        if changes.capacity_freed or quota_moved:
            admit_queued(self.book)

    async def _fresh(
        self, intents: list[tuple[WorkloadIntent, str | None]]
    ) -> list[tuple[WorkloadIntent, str | None]]:
        """Drop intents processed before (a redelivery) and creates of forgotten workloads."""
        unknown = [i.workload_id for i, _ in intents if i.workload_id not in self.book.workloads]
        seen, known = await self.store.screen([i.intent_id for i, _ in intents], unknown)
        self._stored_regions = {w: region for w, (_, region) in known.items()}
        fresh = []
        for intent, request_id in intents:
            if intent.intent_id in seen:
                continue  # processed before
            stored = known.get(intent.workload_id)
            if stored is not None and stored[1] == self.region and intent.handover is None:
                continue  # about a workload long removed
            # (A hand-over of a workload the store knows is taken, and one another region
            # holds now is passed on there: ADR-0022.)
            seen.add(intent.intent_id)
            fresh.append((intent, request_id))
        return fresh

    async def _reload(self) -> None:
        """Back to what the store holds (the failed cycle's decisions were never committed),
        then the machines' latest values again, which the failed cycle may have applied."""
        if self._projecting:
            await asyncio.wait(list(self._projecting))  # their failures are requeued in load
        await self.load(reloading=True)
        self._stale = False
        self._queue.put_nowait(_Replay(self.reader.latest_values()))

    def _requeue(self, items: list[_Input]) -> None:
        """Machine values a failed cycle had not yet cached are given another cycle."""
        for item in items:
            if isinstance(item, _Present) or (
                isinstance(item, MachineKey) and (item.kind == "desired" or item.deleted)
            ):
                self._queue.put_nowait(item)


def _enrolment(machine_id: str, value: bytes | None) -> Enrolment | None:
    if value is None:
        return None
    try:
        return Enrolment.from_bytes(value)
    except ValidationError as exc:
        log.warning(
            "unreadable enrolment ignored (the machine does not count)",
            extra={"machine_id": machine_id, "error": what_is_wrong(exc)},
        )
        return None


def _settle(waiting: list[asyncio.Future[None]]) -> None:
    for future in waiting:
        if not future.done():
            future.set_result(None)


def _fail(waiting: list[asyncio.Future[None]], exc: Exception) -> None:
    for future in waiting:
        if not future.done():
            future.set_exception(CycleFailed(f"not yet recorded: {exc!r}"))


def _book_from(
    snapshot: Snapshot,
    region: str,
    catalog: Catalog,
    now: float,
    tokens: WorkloadTokens,
    owner_tenant: str | None,
    community_pool: bool,
    clock: Callable[[], datetime],
    *,
    sim_machines: bool,
) -> Book:
    book = Book(
        region,
        catalog,
        tokens,
        owner_tenant=owner_tenant,
        community_pool=community_pool,
        sim_machines=sim_machines,
        clock=clock,
    )
    loaded_at = clock()
    for workload in snapshot.workloads:
        workload.access_token = book.access_token_for(workload.workload_id)
        if workload.state is WorkloadState.running:
            # The store keeps no start time: a guest's minimum runtime counts from the load,
            # so a restart can only delay its preemption, never hasten it (ADR-0017).
            workload.running_since = loaded_at
        book.workloads[workload.workload_id] = workload
    for machine in snapshot.machines:
        # A machine gets a full grace period after the scheduler starts, unless it was lost:
        # only a report brings a lost machine back.
        machine.last_seen = now if machine.liveness is not Liveness.lost else float("-inf")
        machine.observed_generation = machine.generation
        book.add_machine(machine, new=False)
    for workload in snapshot.workloads:
        if workload.region != region:
            continue  # handed over to another region; loaded for its rows here only
        if workload.state in (WorkloadState.pending, WorkloadState.queued):
            workload.pending_since = workload.pending_since or workload.created_at
            chain.requeue(book, workload)
    book.begin()
    return book
