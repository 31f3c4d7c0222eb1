"""Prometheus metrics of one region's scheduler, in a registry of its own.

- `einsora_scheduler_admissions_total{outcome}`: workloads placed (`placed`) or queued (`queued`)
  by admission;
- `einsora_scheduler_decisions_total{kind,state}`: every timeline entry decided (a transition to
  `state`, or a note), as committed;
- `einsora_scheduler_queue_depth{pool}`: workloads waiting in each pool's queue;
- `einsora_scheduler_machines{liveness}`: machines of the region by liveness;
- `einsora_scheduler_cycle_seconds`: how long a cycle took to decide and commit;
- `einsora_scheduler_kv_write_lag_seconds`: from a cycle's commit to its desired states stored
  in KV (acknowledged by JetStream);
- `einsora_scheduler_leader` and `einsora_scheduler_lease_term`: whether this scheduler holds its
  region's lease, and the lease's term (ADR-0021);
- the intents consumer's redeliveries and terminations (einsora.common.bus.consumer).

The gauges are read from the book at most once a second, on the engine's own task (the scrape
runs on another thread and never touches the book).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from einsora.common import metrics
from einsora.common.schemas import EventKind, WorkloadState
from einsora.scheduler.book import Book, Changes
from einsora.scheduler.hooks import EngineHooks
from einsora.scheduler.model import Liveness

GAUGES_EVERY_S = 1.0

_ADMISSION = {WorkloadState.scheduled: "placed", WorkloadState.queued: "queued"}


class SchedulerMetrics(EngineHooks):
    """The scheduler's counters, gauges and histograms; the engine's hooks feed them."""

    def __init__(self, region: str, book: Callable[[], Book]) -> None:
        self.registry = metrics.new_registry()
        self._book = book
        self.admissions = Counter(
            "einsora_scheduler_admissions",
            "Workloads admission placed or queued, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "einsora_scheduler_decisions",
            "Timeline entries the scheduler decided and committed, by kind and state",
            ["kind", "state"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "einsora_scheduler_queue_depth",
            "Workloads waiting for capacity, by pool",
            ["pool"],
            registry=self.registry,
        )
        self.machines = Gauge(
            "einsora_scheduler_machines",
            "Machines of this region, by liveness",
            ["liveness"],
            registry=self.registry,
        )
        self.cycle = Histogram(
            "einsora_scheduler_cycle_seconds",
            "Time a scheduler cycle took to decide and commit",
            buckets=metrics.CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.cycles_failed = Counter(
            "einsora_scheduler_cycles_failed",
            "Cycles rolled back (store or bus unavailable); their intents are retried",
            registry=self.registry,
        )
        self.kv_write_lag = Histogram(
            "einsora_scheduler_kv_write_lag_seconds",
            "Time from a cycle's commit to its desired states acknowledged in KV",
            buckets=metrics.CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.leader = Gauge(
            "einsora_scheduler_leader",
            "1 while this scheduler holds its region's leader lease, else 0",
            ["region"],
            registry=self.registry,
        )
        self.term = Gauge(
            "einsora_scheduler_lease_term",
            "The term of the region's leader lease this scheduler last saw",
            ["region"],
            registry=self.registry,
        )
        self._admitted = {
            state: self.admissions.labels(outcome) for state, outcome in _ADMISSION.items()
        }
        self.leader.labels(region).set(0)
        self.term.labels(region).set(0)
        self._region = region
        self._children: dict[tuple[str, str], Counter] = {}
        self._gauges_at = 0.0
        self._pools: set[str] = set()

    def committed(self, changes: Changes) -> None:
        for e in changes.events:
            event = e.event
            key = (event.kind.value, event.state.value)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self.decisions.labels(*key)
            child.inc()
            if event.kind is EventKind.transition:
                admitted = self._admitted.get(event.state)
                if admitted is not None:
                    admitted.inc()

    def cycled(self, seconds: float, *, failed: bool) -> None:
        self.cycle.observe(seconds)
        if failed:
            self.cycles_failed.inc()
        now = time.monotonic()
        if now - self._gauges_at >= GAUGES_EVERY_S:
            self._gauges_at = now
            self._read_book()

    def _read_book(self) -> None:
        book = self._book()
        pools = {pool: len(queue) for pool, queue in book.queue.items()}
        for pool in self._pools - pools.keys():
            self.queue_depth.labels(pool).set(0)
        for pool, depth in pools.items():
            self.queue_depth.labels(pool).set(depth)
        self._pools |= pools.keys()
        by_liveness: dict[str, int] = {}
        for machine in book.machines.values():
            key = machine.liveness.value
            by_liveness[key] = by_liveness.get(key, 0) + 1
        for liveness in Liveness:
            self.machines.labels(liveness.value).set(by_liveness.get(liveness.value, 0))

    def desired_written(self, seconds: float) -> None:
        self.kv_write_lag.observe(seconds)

    def lease(self, *, leader: bool, term: int) -> None:
        self.leader.labels(self._region).set(1 if leader else 0)
        self.term.labels(self._region).set(term)
