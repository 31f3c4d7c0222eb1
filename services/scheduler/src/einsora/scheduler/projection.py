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

Desired-state writes are fenced, so a deposed leader's never land after its successor's (issue
35, F1; ADR-0021). On a single server each carries the lease's term fence (`fence`). A clustered
stream refuses a second conditional write on one subject while one is in flight (JetStream's
error 10164), so there each write is fenced on its own key instead (`per_key`): it expects the
key at the revision this scheduler last wrote there, or last read there and judged against its
book (a snapshot, a watched change). The expected revision is fixed when the projection is
prepared, or, for a key the previous projection is still writing, is that write's own revision
once acked (a write after a failed one is not sent). A write another scheduler's write
overtook is refused, and the key is judged again when its new value is read. Only the key's own
writes queue behind each other; other machines' go out together as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from einsora.scheduler.replaceable import replaceable
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
    bases: list[int | asyncio.Future[int]] = field(default_factory=list)
    """Per desired write, fenced per key: the revision its key is expected at, or the write of
    that key still in flight whose revision it is once acked."""
    written: list[asyncio.Future[int]] = field(default_factory=list)
    """Per desired write, fenced per key: its revision once acked (what a later write of the
    key expects)."""

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
        self.per_key = False
        """Fence each desired write on its own key's revision instead (a clustered stream)."""
        self.revisions: dict[str, int] = {}
        """Fenced per key: the revision each machine's desired key is expected at."""
        self._inflight: dict[str, asyncio.Future[int]] = {}
        """Fenced per key: each key's latest write not yet settled."""
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
                    replaceable=replaceable(w),
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
        if self.per_key:
            self._fence_each_key(projection)
        if telemetry.ON:
            projection.traces = desired_traces(book, events, [m for m, _, _ in desired])
        return projection

    def _fence_each_key(self, projection: Projection) -> None:
        """Fix what each desired write expects of its key, now that its content is fixed."""
        loop = asyncio.get_running_loop()
        for machine_id, _, _ in projection.desired:
            previous = self._inflight.get(machine_id)
            projection.bases.append(
                previous if previous is not None else self.revisions.get(machine_id, 0)
            )
            written: asyncio.Future[int] = loop.create_future()
            written.add_done_callback(_retrieved)
            projection.written.append(written)
            self._inflight[machine_id] = written

    def forget_writes(self) -> None:
        """No write is in flight (a reload): what each key is expected at stays."""
        for written in self._inflight.values():
            if not written.done():
                written.set_exception(ProjectionFailed("reloaded"))
        self._inflight.clear()

    async def _fenced_headers(
        self, projection: Projection, headers: list[dict[str, str] | None]
    ) -> list[dict[str, str] | None]:
        """Each desired write's headers with the revision its key is expected at; None for a
        write not to send (the write of its key before it failed, or is still unanswered)."""
        fenced: list[dict[str, str] | None] = []
        for base, each in zip(projection.bases, headers, strict=True):
            if isinstance(base, asyncio.Future):
                try:
                    base = await asyncio.wait_for(asyncio.shield(base), self._timeout)
                except Exception:
                    fenced.append(None)
                    continue
            fenced.append({**(each or {}), names.EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER: str(base)})
        return fenced

    async def _send_fenced(
        self, projection: Projection, headers: list[dict[str, str] | None]
    ) -> list[asyncio.Future[PubAck]]:
        """Send each desired write its key's fence allows; a write held back counts as failed
        (its key stays dirty), exactly as one the server refused."""
        fenced = await self._fenced_headers(projection, headers)
        loop = asyncio.get_running_loop()
        to_send = [
            (names.MACHINES.key_subject(names.desired_key(m)), payload, h)
            for (m, _, payload), h in zip(projection.desired, fenced, strict=True)
            if h is not None
        ]
        sent = iter(await self._send(to_send))
        futures: list[asyncio.Future[PubAck]] = []
        for h in fenced:
            future = next(sent, None) if h is not None else None
            if future is None:
                future = loop.create_future()
                future.set_exception(ProjectionFailed("not sent: its key's last write failed"))
                future.add_done_callback(_retrieved)
            futures.append(future)
        return futures

    def _settle_fences(self, projection: Projection, acks: list[PubAck | BaseException]) -> None:
        """Each desired write's revision, for what a later write of its key expects."""
        for (machine_id, _, _), written, ack in zip(
            projection.desired, projection.written, acks, strict=False
        ):
            if isinstance(ack, PubAck):
                self.revisions[machine_id] = max(ack.seq, self.revisions.get(machine_id, 0))
                if not written.done():
                    written.set_result(ack.seq)
            elif not written.done():
                written.set_exception(ProjectionFailed(f"not written: {ack!r}"))
            if self._inflight.get(machine_id) is written:
                del self._inflight[machine_id]
        for written in projection.written:
            if not written.done():
                written.set_exception(ProjectionFailed("not written"))

    async def write(self, projection: Projection, after: Projection | None = None) -> None:
        """Send `projection`'s desired states, and once they are stored its events and routes
        (each after `after`'s, so every key's writes stay in order). What failed goes back to
        pending; raises ProjectionFailed if anything did."""
        try:
            if after is not None:
                await after.desired_sent.wait()
            spans = desired_spans(projection.desired, projection.traces) if telemetry.ON else None
            headers = desired_headers(len(projection.desired), self.fence, spans)
            if projection.bases:
                desired = await self._send_fenced(projection, headers)
            else:
                desired = await self._send(
                    (names.MACHINES.key_subject(names.desired_key(m)), payload, h)
                    for (m, _, payload), h in zip(projection.desired, headers, strict=True)
                )
            projection.desired_sent.set()
            acks = await self._settle(desired)
            acks += [TimeoutError("not sent")] * (len(projection.desired) - len(acks))
            if projection.written:
                self._settle_fences(projection, acks)
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
            for written in projection.written:
                if not written.done():
                    written.set_exception(ProjectionFailed("not written"))
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


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A future whose failure nobody may wait for is still retrieved (no warning at exit)."""
    if not future.cancelled():
        future.exception()
