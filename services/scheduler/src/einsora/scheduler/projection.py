"""Projecting the store onto the bus: desired states, then events, then routes.

Everything here is a replayable copy of what the store already holds (ADR-0004):
- each affected machine's complete desired state, at the generation the store gave it, built
  from the book (which mirrors the store) when written, so a rewrite is always the same value;
- each decided event, with `Nats-Msg-Id` = its `event_id` (`<workload>-<seq>`), so a republish
  is dropped by JetStream and ignored by consumers;
- each running workload's route (put) and each stopped one's (delete).

What could not be written stays pending and is retried by the next flush; an intent is acked
only after a flush that left nothing pending.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.kv import KeyValue

from einsora.common.bus import message_headers, names
from einsora.common.errors import EinsoraError
from einsora.common.schemas import DesiredState, DesiredWorkload, Route
from einsora.scheduler.book import Book, Changes, OutboxEvent
from einsora.scheduler.model import Machine

log = logging.getLogger("einsora.scheduler.projection")


class ProjectionFailed(EinsoraError):
    """Part of the projection could not be written; it stays pending and is retried."""

    code = "projection_failed"
    retryable = True


class Projector:
    """Pending projections and how to write them."""

    def __init__(
        self, js: JetStreamContext, routes: KeyValue, *, publish_timeout_s: float = 5.0
    ) -> None:
        self._js = js
        self._routes = routes
        self._timeout = publish_timeout_s
        self.dirty: set[str] = set()
        """Machines whose desired state in KV may lag the store."""
        self.written_revision: dict[str, int] = {}
        """The KV revision of each machine's last desired state written by this process."""
        self.events: list[OutboxEvent] = []
        self.published: list[str] = []
        """Events on the bus whose outbox rows the next store commit forgets."""
        self.routes: dict[str, Route | None] = {}

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
                    class_name=w.class_name,
                    target=row.target,
                    spec=w.spec,
                    resources=row.resources(),
                    access_token=w.access_token,
                )
            )
        return DesiredState(
            machine_id=machine.machine_id, generation=machine.generation, workloads=workloads
        )

    async def flush(self, book: Book) -> None:
        """Write desired states, then publish events, then write routes; raise if any failed."""
        await self._flush_desired(book)
        await self._flush_events()
        await self._flush_routes()

    async def _flush_desired(self, book: Book) -> None:
        machines = [book.machines[m] for m in sorted(self.dirty) if m in book.machines]
        self.dirty -= {m for m in self.dirty if m not in book.machines}
        if not machines:
            return
        futures = [
            await self._js.publish_async(
                names.MACHINES.key_subject(names.desired_key(m.machine_id)),
                self.desired_state(book, m).to_bytes(),
            )
            for m in machines
        ]
        acks = await self._settle(futures)
        failed = 0
        for machine, ack in zip(machines, acks, strict=True):
            if isinstance(ack, PubAck):
                self.written_revision[machine.machine_id] = ack.seq
                self.dirty.discard(machine.machine_id)
            else:
                failed += 1
        if failed:
            raise ProjectionFailed(f"{failed} desired states could not be written; retrying")

    async def _flush_events(self) -> None:
        if not self.events:
            return
        events = self.events
        futures = [
            await self._js.publish_async(
                names.event_subject(e.event.workload_id),
                e.event.to_bytes(),
                headers=message_headers(request_id=e.request_id, msg_id=e.event.event_id),
            )
            for e in events
        ]
        acks = await self._settle(futures)
        self.events = [
            e for e, ack in zip(events, acks, strict=True) if not isinstance(ack, PubAck)
        ]
        self.published.extend(
            e.event.event_id for e, ack in zip(events, acks, strict=True) if isinstance(ack, PubAck)
        )
        if self.events:
            raise ProjectionFailed(f"{len(self.events)} events could not be published; retrying")

    async def _flush_routes(self) -> None:
        if not self.routes:
            return
        routes = self.routes
        self.routes = {}
        calls: list[Awaitable[Any]] = []
        for workload_id, route in routes.items():
            key = names.route_key(workload_id)
            if route is None:
                calls.append(self._routes.delete(key))
            else:
                calls.append(self._routes.put(key, route.to_bytes()))
        results = await asyncio.gather(*calls, return_exceptions=True)
        for (workload_id, route), result in zip(routes.items(), results, strict=True):
            if isinstance(result, BaseException):
                self.routes.setdefault(workload_id, route)
        if self.routes:
            raise ProjectionFailed(f"{len(self.routes)} routes could not be written; retrying")

    async def _settle(
        self, futures: Sequence[asyncio.Future[PubAck]]
    ) -> list[PubAck | BaseException]:
        """Wait for every ack (or its failure), never longer than the publish timeout."""
        done, pending = (
            await asyncio.wait(futures, timeout=self._timeout) if futures else (set(), set())
        )
        for future in pending:
            future.cancel()
        results: list[PubAck | BaseException] = []
        for future in futures:
            if future in done and not future.cancelled() and future.exception() is None:
                results.append(future.result())
            elif future in done and not future.cancelled():
                exc = future.exception()
                assert exc is not None
                results.append(exc)
            else:
                results.append(TimeoutError("no ack in time"))
        if any(not isinstance(r, PubAck) for r in results):
            log.warning(
                "some publishes failed",
                extra={"failed": sum(1 for r in results if not isinstance(r, PubAck))},
            )
        return results
