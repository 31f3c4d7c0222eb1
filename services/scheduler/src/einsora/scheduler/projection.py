"""Projecting the store onto the bus: desired states, events and routes, sent together.

Everything here is a replayable copy of what the store already holds (ADR-0004):
- each affected machine's complete desired state, at the generation the store gave it, built
  from the book (which mirrors the store) when written, so a rewrite is always the same value;
- each decided event, with `Nats-Msg-Id` = its `event_id` (`<workload>-<seq>`), so a republish
  is dropped by JetStream and ignored by consumers;
- each running workload's route (put) and each stopped one's (delete).

A cycle's projection is serialised the moment its decisions are committed (`prepare`), then
sent while the next cycle decides (`write`): its desired states, then, once they are stored,
its events and routes together (a burst's events as atomic batches, one commit each:
bus/batch.py); each after the previous projection's, so every key's writes stay in order. What
could not be written goes back to pending and is retried by a later projection; an intent is
acked only after its cycle's projection was written in full (ADR-0004).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from prometheus_client import CollectorRegistry

from einsora.common import telemetry
from einsora.common.bus import message_headers, names
from einsora.common.bus.batch import BatchPublisher, Message, publish_pipelined, settle
from einsora.common.errors import EinsoraError
from einsora.common.schemas import DesiredState, DesiredWorkload, Route
from einsora.scheduler.book import Book, Changes, OutboxEvent
from einsora.scheduler.model import Machine
from einsora.scheduler.tracing import desired_headers, desired_spans, desired_traces, end_spans

log = logging.getLogger("einsora.scheduler.projection")


class ProjectionFailed(EinsoraError):
    """Part of the projection could not be written; it stays pending and is retried."""

    code = "projection_failed"
    retryable = True


_KV_DELETE = {"KV-Operation": "DEL"}
"""What nats-py's `KeyValue.delete` sends: a delete marker on the key's subject."""


@dataclass
class Projection:
    """One cycle's writes, serialised when its decisions were committed."""

    desired: list[tuple[str, int, bytes]]
    """(machine, generation, complete desired state) for each affected machine."""
    events: list[OutboxEvent]
    routes: dict[str, Route | None]
    traces: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """machine → the (traceparent, request id) of the decisions its write carries (tracing on)."""
    prepared_at: float = field(default_factory=time.perf_counter)
    """When its decisions were committed: its desired states' KV write lag counts from here."""
    desired_sent: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once its desired states are on the wire: the next projection may send its own."""
    events_sent: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once its events and routes are on the wire (or will not be sent)."""

    @property
    def size(self) -> int:
        return len(self.desired) + len(self.events) + len(self.routes)


class Projector:
    """Pending projections and how to write them."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        *,
        publish_timeout_s: float = 5.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._js = js
        self._timeout = publish_timeout_s
        self.events_out = BatchPublisher(
            nc, js, stream=names.EVENTS.name, timeout_s=publish_timeout_s, registry=registry
        )
        self.dirty: set[str] = set()
        """Machines whose desired state in KV may lag the store."""
        self.written_revision: dict[str, int] = {}
        """The KV revision of each machine's last desired state written by this process."""
        self.events: list[OutboxEvent] = []
        self.published: list[str] = []
        """Events on the bus whose outbox rows the next store commit forgets."""
        self.routes: dict[str, Route | None] = {}
        self.writing: dict[str, int] = {}
        """Machines whose desired state is on its way, at this generation."""
        self.fence: dict[str, str] | None = None
        """Headers every desired-state write carries: the leader's fence (lease.py), which makes
        NATS refuse the write once another scheduler took the lease; None: unfenced."""
        self.on_desired_written: Callable[[float], None] | None = None
        """Told each projection's KV write lag: from its commit to its desired states' acks."""

    @property
    def pending(self) -> bool:
        return bool(self.dirty or self.events or self.routes)

    def take(self, changes: Changes) -> None:
        """Queue what a committed cycle changed."""
        self.dirty |= changes.desired
        self.events.extend(changes.events)
        self.routes.update(changes.routes)

    def desired_state(self, book: Book, machine: Machine) -> DesiredState:
        workloads = []
        for row in machine.rows.values():
            w = book.workloads[row.workload_id]
            workloads.append(
                DesiredWorkload(
                    workload_id=w.workload_id,
                    tenant_id=w.tenant_id,
                    kind=w.kind,
                    class_name=w.placed_class or w.class_name,  # a fallback's class
                    target=row.target,
                    name=w.name,
                    spec=w.spec,
                    resources=row.resources(),
                    access_token=w.access_token,
                    traceparent=w.traceparent,
                    request_id=w.request_id if w.traceparent else None,
                    driver=row.driver,
                )
            )
        return DesiredState(
            machine_id=machine.machine_id, generation=machine.generation, workloads=workloads
        )

    def prepare(self, book: Book) -> Projection | None:
        """Everything pending, serialised now, while the book holds only committed decisions
        (call it straight after a commit, with no await in between); None when nothing is."""
        machines = [book.machines[m] for m in sorted(self.dirty) if m in book.machines]
        self.dirty = set()
        desired = [
            (m.machine_id, m.generation, self.desired_state(book, m).to_bytes()) for m in machines
        ]
        for machine_id, generation, _ in desired:
            self.writing[machine_id] = generation
        events, self.events = self.events, []
        routes, self.routes = self.routes, {}
        if not (desired or events or routes):
            return None
        projection = Projection(desired, events, routes)
        if telemetry.ON:
            projection.traces = desired_traces(book, events, [m for m, _, _ in desired])
        return projection

    async def write(self, projection: Projection, after: Projection | None = None) -> None:
        """Send `projection`'s desired states, and once they are stored its events and routes
        (each after `after`'s, so every key's writes stay in order). What failed goes back to
        pending; raises ProjectionFailed if anything did."""
        try:
            if after is not None:
                await after.desired_sent.wait()
            spans = desired_spans(projection.desired, projection.traces) if telemetry.ON else None
            headers = desired_headers(len(projection.desired), self.fence, spans)
            desired = await self._send(
                (names.MACHINES.key_subject(names.desired_key(m)), payload, h)
                for (m, _, payload), h in zip(projection.desired, headers, strict=True)
            )
            projection.desired_sent.set()
            acks = await self._settle(desired)
            acks += [TimeoutError("not sent")] * (len(projection.desired) - len(acks))
            if spans is not None:
                end_spans(spans, acks)
            if self.on_desired_written is not None and projection.desired:
                self.on_desired_written(time.perf_counter() - projection.prepared_at)
            if all(isinstance(a, PubAck) for a in acks):
                # The timeline promises what the agent can see: events after desired states.
                if after is not None:
                    await after.events_sent.wait()
                routes = await self._send(self._routes(projection))
                # Sent whole before the next projection's, even where a batch falls back to
                # one by one, so a workload's events are stored in their order.
                events = await self.events_out.publish(self._events(projection))
                projection.events_sent.set()
                acks += events + await self._settle(routes)
        finally:
            # Whatever happened, the next projection must not wait on this one for ever.
            projection.desired_sent.set()
            projection.events_sent.set()
        acks += [TimeoutError("not sent")] * (projection.size - len(acks))
        self._settled(projection, acks)

    @staticmethod
    def _events(projection: Projection) -> list[Message]:
        return [
            (
                names.event_subject(e.event.workload_id),
                e.event.to_bytes(),
                message_headers(
                    request_id=e.request_id, msg_id=e.event.event_id, traceparent=e.traceparent
                ),
            )
            for e in projection.events
        ]

    @staticmethod
    def _routes(projection: Projection) -> Iterator[tuple[str, bytes, dict[str, str] | None]]:
        for workload_id, route in projection.routes.items():
            subject = names.ROUTES.key_subject(names.route_key(workload_id))
            if route is None:
                yield subject, b"", _KV_DELETE
            else:
                yield subject, route.to_bytes(), None

    async def _send(
        self, messages: Iterable[tuple[str, bytes, dict[str, str] | None]]
    ) -> list[asyncio.Future[PubAck]]:
        """Publish each message without waiting for its ack; stops at the first that cannot
        be sent (the rest count as failed)."""
        futures, failure = await publish_pipelined(self._js, messages)
        if failure is not None:
            log.warning("publishing the projection failed", extra={"error": repr(failure)})
        return futures

    def _settled(self, projection: Projection, acks: list[PubAck | BaseException]) -> None:
        n_desired, n_events = len(projection.desired), len(projection.events)
        failed = 0
        for (machine_id, generation, _), ack in zip(
            projection.desired, acks[:n_desired], strict=True
        ):
            if self.writing.get(machine_id) == generation:
                del self.writing[machine_id]
            if isinstance(ack, PubAck):
                self.written_revision[machine_id] = max(
                    ack.seq, self.written_revision.get(machine_id, 0)
                )
            else:
                failed += 1
                self.dirty.add(machine_id)  # rewritten from the book by a later projection
        unsent: list[OutboxEvent] = []
        for e, ack in zip(projection.events, acks[n_desired : n_desired + n_events], strict=True):
            if isinstance(ack, PubAck):
                self.published.append(e.event.event_id)
            else:
                unsent.append(e)
        # Before what later cycles queued meanwhile, so each workload's events keep their order.
        self.events[:0] = unsent
        failed += len(unsent)
        route_acks = acks[n_desired + n_events :]
        for (workload_id, route), ack in zip(projection.routes.items(), route_acks, strict=True):
            if not isinstance(ack, PubAck):
                failed += 1
                self.routes.setdefault(workload_id, route)
        if failed:
            raise ProjectionFailed(f"{failed} of {projection.size} writes failed; retrying")

    async def _settle(
        self, futures: Sequence[asyncio.Future[PubAck]]
    ) -> list[PubAck | BaseException]:
        """Wait for every ack (or its failure), never longer than the publish timeout."""
        results = await settle(futures, self._timeout)
        failed = sum(1 for r in results if not isinstance(r, PubAck))
        if failed:
            log.warning("some publishes failed", extra={"failed": failed})
        return results
