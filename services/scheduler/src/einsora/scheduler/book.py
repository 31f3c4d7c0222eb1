"""The book: the scheduler's whole state in memory, and the changes one cycle makes to it.

The book holds state and decides nothing (ADR-0030; an import contract keeps it from importing
any filter, order or reason module): machines, workloads, their rows, the queues, the capacity
index, and caches of what is derived from machines (dropped whenever one changes). Every
decision goes through the book's few primitives (set a row, drop a row, emit an event,
set a route), which record what changed in `Changes`. The engine then commits exactly those
changes to the store in one transaction and projects them onto the bus, so the store and the
bus never hear of a change the other could miss (ADR-0004).

A machine's generation rises once per cycle in which any of its rows changed, whatever the
number of rows, so each affected machine's desired state is written once per cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from einsora.common import lifecycle, telemetry
from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    Endpoint,
    EventKind,
    Metered,
    Placement,
    RegionStatus,
    Route,
    Target,
    TenantQuota,
    TenantUsage,
    WorkloadEvent,
    WorkloadIntent,
    WorkloadState,
    utcnow,
)
from einsora.common.targets import OwnPorts
from einsora.scheduler.capacity import CapacityIndex, gpus_by_class, lent_gpus_by_class
from einsora.scheduler.model import Machine, Preemption, Row, Workload
from einsora.scheduler.queue import PoolQueue
from einsora.scheduler.tokens import WorkloadTokens

log = logging.getLogger("einsora.scheduler.book")


@dataclass(frozen=True)
class OutboxEvent:
    """An event decided in a cycle: stored with the decision, then published."""

    event: WorkloadEvent
    request_id: str
    traceparent: str | None = None
    """The trace it belongs to (tracing on): published in its `traceparent` header."""


@dataclass(frozen=True)
class Handoff:
    """An intent passed on to another region's scheduler (a region step, or an intent that came
    after one): stored with the decision, then published (ADR-0022)."""

    intent: WorkloadIntent
    request_id: str


@dataclass(frozen=True)
class ProcessedIntent:
    """An intent handled once; its id makes a redelivery change nothing."""

    intent_id: str
    workload_id: str
    action: str


@dataclass
class Changes:
    """What one cycle changed: the store's next transaction and the bus's next projection."""

    new_machines: set[str] = field(default_factory=set)
    machines: dict[str, Machine] = field(default_factory=dict)
    new_workloads: set[str] = field(default_factory=set)
    workloads: dict[str, Workload] = field(default_factory=dict)
    rows: dict[tuple[str, str], Row | None] = field(default_factory=dict)
    new_rows: set[tuple[str, str]] = field(default_factory=set)
    """Rows the store has never had: inserted without deleting first."""
    intents: list[ProcessedIntent] = field(default_factory=list)
    events: list[OutboxEvent] = field(default_factory=list)
    routes: dict[str, Route | None] = field(default_factory=dict)
    desired: set[str] = field(default_factory=set)
    capacity_freed: bool = False
    handoffs: list[Handoff] = field(default_factory=list)
    """Intents for other regions decided this cycle (handover.py)."""
    handoffs_sent: list[str] = field(default_factory=list)
    """Handoffs published since the last commit: their stored rows are forgotten."""
    ahead: set[str] = field(default_factory=set)
    """Intents (ids) that came before their workload's create: not processed, handed back to
    the bus to come again once the create is (intents.py)."""

    @property
    def to_store(self) -> bool:
        return bool(
            self.machines
            or self.workloads
            or self.rows
            or self.intents
            or self.events
            or self.handoffs
            or self.handoffs_sent
        )


class Book:
    """Machines, workloads, rows, the queue and the capacity index of one region."""

    def __init__(
        self,
        region: str,
        catalog: Catalog,
        tokens: WorkloadTokens | None = None,
        *,
        owner_tenant: str | None = None,
        community_pool: bool = False,
        sim_machines: bool = False,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.region = region
        self.clock = clock
        """The wall clock reclaims are judged by (a test's own, to pass a grace at once)."""
        self.notice_since: dict[str, datetime] = {}
        """Guests' workloads on machines no longer shared with them, or whose owner no longer
        lends what they hold: since when (first seen), the start of their grace (reclaim.py)."""
        self.preempt_notes: dict[str, tuple[Preemption, datetime]] = {}
        """Why and when each guest's workload was last told it goes (reclaim.py)."""
        self.catalog = catalog
        self.quotas: dict[str, TenantQuota] = {}
        """Each tenant's quota (the `usage` bucket), by tenant id."""
        self.usage: dict[str, TenantUsage] = {}
        """Each tenant's recent use, from accounting (the `usage` bucket)."""
        self.event_at: datetime | None = None
        """When what is being decided happened, on this control plane's clock (the receipt of
        an agent's report, a lost machine's last heartbeat); None: now. Events carry it, so
        accounting meters from the moment of the change, never from an agent's clock."""
        self.tokens = tokens or WorkloadTokens.ephemeral()
        self.owner_tenant = owner_tenant
        self.community_pool = community_pool
        """The tenant that owns the region's machines until enrolment says otherwise (trust.py)."""
        self.sim_machines = sim_machines
        """The operator allows sim machines here: only then does a machine's `sim` count
        (drivers.py; issue 34, N9)."""
        self.sim_ignored: set[str] = set()
        """Machines whose `sim` was ignored, each said once in the log (observe.py)."""
        self.machines: dict[str, Machine] = {}
        self.workloads: dict[str, Workload] = {}
        self.queue: dict[str, PoolQueue] = {}
        """Each pool's queued workloads (a chained workload in each pool it waits in)."""
        self.index = CapacityIndex()
        self.routes: dict[str, Endpoint] = {}
        """The endpoint each running workload's agent last reported (its route written from it,
        or refused)."""
        self.own_ports = OwnPorts(frozenset())
        """The control plane's own ports: no route reaches them (targets.py; the service sets
        them from its settings)."""
        self.changes = Changes()
        self.chained: dict[str, Workload] = {}
        """Queued workloads with a fallback chain, whose timer may reach a further step
        (chain.py)."""
        self.regions: dict[str, RegionStatus] = {}
        """The other regions' schedulers, as they last said (regions.py)."""
        self.derived: dict[Hashable, object] = {}
        """What filters derived from the machines (`filters/usable.py`), until one changes."""

    def begin(self) -> Changes:
        """Start a cycle: later primitives record into a fresh `Changes`."""
        self.changes = Changes()
        return self.changes

    # --- machines ---------------------------------------------------------------------------

    def add_machine(self, machine: Machine, *, new: bool) -> None:
        self.machines[machine.machine_id] = machine
        self.machine_changed(machine)
        if new:
            self.changes.new_machines.add(machine.machine_id)
            self.save_machine(machine)
            self.touch(machine)

    def machine_changed(self, machine: Machine) -> None:
        """Its inventory, liveness or settling changed: re-file it and recheck the queue."""
        machine.gpus_by_class = gpus_by_class(machine.inventory, self.catalog)
        machine.lent_gpus_by_class = lent_gpus_by_class(machine)
        self.index.update(machine)
        self.derived.clear()
        self.changes.capacity_freed = True

    def save_machine(self, machine: Machine) -> None:
        self.changes.machines[machine.machine_id] = machine

    def touch(self, machine: Machine) -> int:
        """Raise the machine's generation, once per cycle; returns the generation."""
        if machine.machine_id not in self.changes.desired:
            machine.generation += 1
            self.changes.desired.add(machine.machine_id)
            self.save_machine(machine)
        return machine.generation

    def raise_generation_above(self, machine: Machine, seen: int) -> None:
        """The bus has a generation the store lacks (a restored store): go past it."""
        if seen >= machine.generation:
            machine.generation = seen
            self.changes.desired.discard(machine.machine_id)
            self.touch(machine)

    def set_row(self, machine: Machine, row: Row) -> None:
        key = (machine.machine_id, row.workload_id)
        if row.workload_id not in machine.rows and key not in self.changes.rows:
            self.changes.new_rows.add(key)
        row.since_generation = self.touch(machine)
        machine.rows[row.workload_id] = row
        self.changes.rows[key] = row
        self.index.update(machine)

    def drop_row(self, machine: Machine, workload_id: str) -> None:
        if machine.rows.pop(workload_id, None) is None:
            return
        self.touch(machine)
        key = (machine.machine_id, workload_id)
        if key in self.changes.new_rows:
            self.changes.new_rows.discard(key)
            del self.changes.rows[key]  # never stored: nothing to delete
        else:
            self.changes.rows[key] = None
        self.index.update(machine)
        self.changes.capacity_freed = True

    def release(self, machine: Machine, row: Row, target: Target) -> None:
        """Give the row's devices, cores and memory back; the row stays, with `target`."""
        freed = row.holds_resources
        row.release()
        row.target = target
        self.set_row(machine, row)
        if freed:
            self.changes.capacity_freed = True

    # --- workloads --------------------------------------------------------------------------

    def add_workload(self, workload: Workload) -> None:
        self.workloads[workload.workload_id] = workload
        self.changes.new_workloads.add(workload.workload_id)
        self.save_workload(workload)

    def save_workload(self, workload: Workload) -> None:
        self.changes.workloads[workload.workload_id] = workload

    def row_of(self, workload: Workload) -> tuple[Machine, Row] | None:
        """The row on the machine the workload is on, if it has one."""
        if workload.machine_id is None:
            return None
        machine = self.machines.get(workload.machine_id)
        if machine is None:
            return None
        row = machine.rows.get(workload.workload_id)
        return None if row is None else (machine, row)

    def access_token_for(self, workload_id: str) -> str:
        """The workload's own token (derived from the key, never stored: tokens.py)."""
        return self.tokens.for_workload(workload_id)

    # --- queue ------------------------------------------------------------------------------

    def enqueue(self, workload: Workload, pool: str) -> None:
        queue = self.queue.get(pool)
        if queue is None:
            queue = self.queue[pool] = PoolQueue(pool)
        queue.add(workload)

    def take(self, workload: Workload) -> None:
        """Out of every pool it waits in: it is placed, or handed to another region."""
        self.chained.pop(workload.workload_id, None)
        for pool, queue in list(self.queue.items()):
            if queue.remove(workload) and not queue:
                del self.queue[pool]

    def dequeue(self, workload: Workload) -> None:
        """Out of every pool it waits in, and what it held back is admitted again (it was
        parked, removed or failed while it waited: ADR-0030)."""
        was_queued = any(workload in queue for queue in self.queue.values())
        self.take(workload)
        if was_queued:
            self.changes.capacity_freed = True

    # --- timeline and routes ----------------------------------------------------------------

    def transition(
        self,
        workload: Workload,
        state: WorkloadState,
        reason: str,
        placement: Placement | None = None,
    ) -> None:
        if not lifecycle.may_follow(workload.state, state):
            # A decision went off the lifecycle table (ADR-0010): a bug, recorded rather than
            # refused, so the timeline still says what the scheduler did.
            log.error(
                "a transition the lifecycle table does not allow",
                extra={
                    "workload_id": workload.workload_id,
                    "from": workload.state.value,
                    "to": state.value,
                },
            )
        if state is WorkloadState.running and workload.state is not WorkloadState.running:
            workload.running_since = self.clock()
        workload.state = state
        workload.reason = reason
        self._emit(workload, EventKind.transition, reason, placement)

    def note(self, workload: Workload, reason: str) -> None:
        self._emit(workload, EventKind.note, reason, None)

    def _emit(
        self, workload: Workload, kind: EventKind, reason: str, placement: Placement | None
    ) -> None:
        workload.seq += 1
        at = self.event_at or utcnow()
        if kind is EventKind.transition:
            last = workload.last_transition_at
            if last is not None and at < last:
                # A lost machine's last heartbeat, turned from monotonic into wall time, can
                # come out a microsecond before the report that was that heartbeat: its
                # transitions stay in order (an allocation never ends before it began).
                at = last
            workload.last_transition_at = at
        event = WorkloadEvent(
            event_id=f"{workload.workload_id}-{workload.seq}",
            workload_id=workload.workload_id,
            tenant_id=workload.tenant_id,
            kind=kind,
            state=workload.state,
            reason=reason,
            seq=workload.seq,
            at=at,
            placement=placement,
            request_id=workload.request_id,
            metered=self._metered(workload) if kind is EventKind.transition else None,
            region=workload.region,
        )
        traceparent = workload.traceparent
        if telemetry.ON:  # inside a decision, its span; else the workload's last one
            traceparent = telemetry.current_traceparent() or traceparent
        self.changes.events.append(
            OutboxEvent(event, workload.request_id or f"scheduler-{self.region}", traceparent)
        )
        self.save_workload(workload)

    def _metered(self, workload: Workload) -> Metered | None:
        """What a placed workload holds, for accounting (None when it is on no machine)."""
        placed = self.row_of(workload)
        if placed is None:
            return None
        machine, row = placed
        return Metered(
            kind=workload.kind,
            class_name=workload.class_name,
            placed_class=workload.placed_class or workload.class_name,
            region=self.region,
            machine=machine.machine_id,
            gpus=list(row.gpus),
            cpus=row.cpus,
            memory_mib=row.memory_mib,
        )

    def put_route(self, workload: Workload, endpoint: Endpoint, route: Route | None) -> None:
        """Keep the endpoint its agent reported, and write the route made of it (None: the
        route was refused and is deleted: `routes.py`)."""
        self.routes[workload.workload_id] = endpoint
        self.changes.routes[workload.workload_id] = route

    def drop_route(self, workload: Workload) -> None:
        self.routes.pop(workload.workload_id, None)
        self.changes.routes[workload.workload_id] = None

    def rows_on(self, machine: Machine) -> Iterator[tuple[Row, Workload | None]]:
        for row in list(machine.rows.values()):
            yield row, self.workloads.get(row.workload_id)
