"""Event streams: workload changes as server-sent events (SSE), learnt from the bus.

A stream follows one workload (`event.workload.<id>`) or all of a tenant's (`event.workload.*`,
filtered here by `tenant_id`). Each opens its own ordered consumer on EVENTS (ephemeral, in
memory on the server, flow-controlled: a slow client holds back its own consumer, not the api),
so it needs no poll of the store and no state shared with other streams or replicas.

Every event's SSE `id` is its EVENTS stream sequence. A client that reconnects with
`Last-Event-ID: N` gets the events after N, each once. A fresh stream, or one whose N the
stream no longer holds (aged out, or from a wiped server), starts with a `snapshot` of the
current states from the store, with no gap between the snapshot and the changes that follow:
- the sequence the snapshot covers is read before the store is: the ack floor of the timeline
  consumer (`api-timeline`), below which every event is committed to the store (it acks only
  after committing); the stream's last sequence would not do, since the timeline may lag it;
- the follow starts after that floor, and an event the snapshot already shows (its workload's
  `seq` not above the snapshot's) is passed over with an id-only frame (`id: N`, no data: SSE
  clients take the id without dispatching an event), so a reconnect resumes after it too.

A `: ping` comment goes out after `heartbeat_s` of silence, so proxies keep the stream open.
One user holds at most `per_account` streams in a tenant on one replica, all their API tokens
and dashboard sessions together (the next is a 429): tokens are free to mint, so a bound per
token would be none. `close()`
(the api's shutdown) ends every stream cleanly, each with its last chunk, before uvicorn stops.

What the api itself records without the bus (a launch's `pending`, a park's `parking` before
the scheduler takes it) shows in a snapshot; the stream's changes are the scheduler's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

import nats.errors
import sqlalchemy as sa
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.consumers.timeline import TIMELINE_CONSUMER
from einsora.api.errors import NotFound, RateLimited, Unavailable, field_error
from einsora.api.schemas.events import CHANGE, SNAPSHOT, SnapshotOut, WorkloadChangeOut
from einsora.api.schemas.workloads import HostOut, PlacementOut
from einsora.api.store import Store
from einsora.common.bus import names
from einsora.common.failures import outlived, outlives
from einsora.common.ids import is_id
from einsora.common.schemas import WorkloadEvent, WorkloadState

log = logging.getLogger("einsora.api.consumers.streams")

MEDIA_TYPE = "text/event-stream"
PING = b": ping\n\n"
RETRY_MS = 1000
"""What an SSE client waits before reconnecting (its `retry:` field)."""
MAX_EVENT_ID_DIGITS = 19  # a uint64 sequence fits; more is not an id this api sent
CLOSE_WAIT_S = 2.0
"""How long `close()` waits for the streams it ended to send their last chunk."""


def frame(*, data: str | None = None, event: str | None = None, id: int | None = None) -> bytes:
    """One SSE frame. `data` is one line of JSON (never a newline in it)."""
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    if data is not None:
        lines.append(f"data: {data}")
    return ("\n".join(lines) + "\n\n").encode()


def parse_last_event_id(value: str | None) -> int | None:
    """The `Last-Event-ID` a client sent (None: none, or empty), or a 422 naming it."""
    if value is None or value.strip() == "":
        return None
    value = value.strip()
    if not value.isascii() or not value.isdigit() or len(value) > MAX_EVENT_ID_DIGITS:
        raise field_error(
            "Last-Event-ID", "is not an event id this API sent (a stream sequence, digits only)"
        )
    return int(value)


Account = tuple[str, str]
"""Whose streams count together: (tenant id, user id)."""


def account_of(principal: Principal) -> Account:
    return principal.tenant_id, principal.user_id


class EventStreams:
    """The api replica's open event streams: opens them, bounds them per account (a user in a
    tenant), ends them."""

    def __init__(
        self, store: Store, js: JetStreamContext, *, heartbeat_s: float, per_account: int
    ) -> None:
        self.store = store
        self.js = js
        self.heartbeat_s = heartbeat_s
        self.per_account = per_account
        self._open: set[EventStream] = set()
        self._held: Counter[Account] = Counter()
        self._closed = False
        self._all_gone = asyncio.Event()
        self._all_gone.set()

    def _claim(self, principal: Principal) -> None:
        if self._closed:
            raise Unavailable("the api is shutting down; reconnect to another replica or later")
        account = account_of(principal)
        held = self._held[account]
        if held >= self.per_account:
            raise RateLimited(
                f"you already hold {held} open event streams in this tenant (all your API "
                "tokens and dashboard sessions count together), the most one user may; close "
                "one (or use /v1/events for every workload) and retry",
                details=[
                    {
                        # The setting's name (`api_streams_per_token`), kept for its users.
                        "field": "streams_per_token",
                        "message": f"{self.per_account} open event streams per user in a tenant",
                        "type": "rate_limit",
                    }
                ],
                headers={"Retry-After": "1"},
            )
        self._held[account] += 1

    def _release(self, stream: EventStream) -> None:
        if stream in self._open:
            self._open.discard(stream)
            account = account_of(stream.principal)
            self._held[account] -= 1
            if self._held[account] <= 0:
                del self._held[account]
        if not self._open:
            self._all_gone.set()

    async def open(
        self, principal: Principal, workload_id: str | None, last_event_id: int | None
    ) -> EventStream:
        """A stream of one workload's changes (or, with None, all the tenant's), following on
        from `last_event_id`; 404 for a workload the tenant does not have, 429 past the
        account's bound, 503 when the bus or the store cannot answer."""
        if workload_id is not None and not is_id(workload_id, "workload"):
            raise NotFound(f"no workload {workload_id!r}")
        self._claim(principal)
        stream = EventStream(self, principal, workload_id)
        self._open.add(stream)
        self._all_gone.clear()
        try:
            await stream.begin(last_event_id)
        except BaseException:
            await stream.close()
            raise
        return stream

    async def close(self) -> None:
        """End every stream (each sends its last chunk) and refuse new ones."""
        self._closed = True
        for stream in list(self._open):
            stream.end()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_gone.wait(), CLOSE_WAIT_S)
        for stream in list(self._open):  # a response that never began to send
            await stream.close()


class EventStream:
    """One open stream: its consumer on EVENTS and what its first frames say."""

    def __init__(self, hub: EventStreams, principal: Principal, workload_id: str | None) -> None:
        self.hub = hub
        self.principal = principal
        self.workload_id = workload_id
        self._sub: JetStreamContext.PushSubscription | None = None
        self._prelude: list[bytes] = [f"retry: {RETRY_MS}\n\n".encode()]
        self._shown: dict[str, int] = {}
        """Workload → its `seq` the snapshot showed: changes up to it are in the snapshot."""
        self._last_sent = 0
        """The highest stream sequence sent; anything not above it is passed over."""
        self._hosts: dict[str, HostOut | None] = {}
        self._ending = asyncio.Event()
        self._closed = False

    @property
    def subject(self) -> str:
        if self.workload_id is None:
            return names.EVENTS_FILTER
        return names.event_subject(self.workload_id)

    async def begin(self, last_event_id: int | None) -> None:
        """Decide where to follow from, read the snapshot when one is due, and subscribe."""
        try:
            info = await self.hub.js.stream_info(names.EVENTS.name)
            first, last = info.state.first_seq, info.state.last_seq
            resumable = last_event_id is not None and first - 1 <= last_event_id <= last
            if resumable:
                assert last_event_id is not None
                start_after = last_event_id
            else:
                # Read before the store is: every event up to it is in what the store answers.
                start_after = max(await self._applied_floor(), first - 1)
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            raise Unavailable(f"the bus cannot answer now ({exc.__class__.__name__})") from exc
        if resumable:
            if self.workload_id is not None:
                await self._check_exists()
        else:
            snapshot = await self._snapshot(start_after)
            self._prelude.append(frame(event=SNAPSHOT, id=start_after, data=snapshot))
        self._last_sent = start_after
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_after + 1
        )
        try:
            self._sub = await self.hub.js.subscribe(
                self.subject, stream=names.EVENTS.name, ordered_consumer=True, config=config
            )
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            raise Unavailable(f"the bus cannot answer now ({exc.__class__.__name__})") from exc

    async def _applied_floor(self) -> int:
        """The stream sequence up to which the timeline holds every event (0: unknown)."""
        try:
            consumer = await self.hub.js.consumer_info(names.EVENTS.name, TIMELINE_CONSUMER)
        except NotFoundError:
            return 0  # no timeline consumer (yet): the snapshot covers nothing for sure
        floor = consumer.ack_floor
        return floor.stream_seq if floor is not None and floor.stream_seq is not None else 0

    async def _check_exists(self) -> None:
        stmt = sa.select(m.workloads.c.id).where(
            m.workloads.c.id == self.workload_id,
            m.workloads.c.tenant_id == self.principal.tenant_id,
        )
        found = await self._query(lambda conn: conn.execute(stmt).first())
        if found is None:
            raise NotFound(f"no workload {self.workload_id!r}")

    async def _snapshot(self, seq: int) -> str:
        rows = await self._query(lambda conn: conn.execute(_snapshot_of(self)).all())
        if self.workload_id is not None and not rows:
            raise NotFound(f"no workload {self.workload_id!r}")
        changes = []
        for r in rows:
            self._shown[r.id] = r.last_seq
            changes.append(_snapshot_item(r._mapping, seq))
        return SnapshotOut(seq=seq, workloads=changes).model_dump_json()

    async def _query(self, unit: Any) -> Any:
        try:
            return await self.hub.store.query(unit)
        except Exception as exc:
            # A refused connection is no SQLAlchemyError: the shared list knows it.
            if not outlives(exc, SQLAlchemyError):
                raise
            raise Unavailable(f"the store cannot answer now ({exc.__class__.__name__})") from exc

    def end(self) -> None:
        """Make the stream send its last chunk now (the api shuts down)."""
        self._ending.set()

    async def frames(self) -> AsyncIterator[bytes]:
        """The stream's bytes: the prelude, then each change, a ping after each silence."""
        for each in self._prelude:
            yield each
        sub = self._sub
        assert sub is not None
        ending = asyncio.ensure_future(self._ending.wait())
        getting: asyncio.Future[Msg] | None = None
        try:
            while not self._ending.is_set():
                if getting is None:
                    getting = asyncio.ensure_future(sub.next_msg(timeout=None))
                waiting: set[asyncio.Future[Any]] = {getting, ending}
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=self.hub.heartbeat_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getting not in done:
                    if not done:
                        yield PING
                    continue
                # Whatever ends a stream here, the client reconnects with its Last-Event-ID
                # and misses nothing.
                try:
                    if getting.cancelled():  # the connection to NATS closed under it
                        return
                    msg = getting.result()
                    out = await self._frame_of(msg)
                except Exception as exc:
                    if not outlives(exc, nats.errors.Error):  # Unavailable is retryable
                        raise
                    log.info("event stream ends", extra={"error": repr(exc)})
                    return
                finally:
                    getting = None
                if out is not None:
                    yield out
        finally:
            ending.cancel()
            if getting is not None:
                getting.cancel()

    async def _frame_of(self, msg: Msg) -> bytes | None:
        """The frame a message makes for this stream's client, or None (not theirs, or sent)."""
        seq = msg.metadata.sequence.stream
        if seq <= self._last_sent:
            return None  # the ordered consumer restarted from further back
        self._last_sent = seq
        try:
            event = WorkloadEvent.from_bytes(msg.data)
        except ValidationError:
            return None  # the timeline refuses it too
        if event.tenant_id != self.principal.tenant_id:
            return None  # never a word of another tenant's workloads
        if msg.subject != _subject_of(event):
            return None  # an event on another workload's subject (the timeline refuses it)
        if self.workload_id is not None and event.workload_id != self.workload_id:
            return None
        shown = self._shown.get(event.workload_id)
        if shown is not None and event.seq <= shown:
            return frame(id=seq)  # in the snapshot: only its id, so a resume passes it too
        placement = None
        if event.placement is not None:
            host = await self._host(event.placement.machine)
            placement = PlacementOut(
                region=event.placement.region,
                machine=event.placement.machine,
                placed_class=event.placement.placed_class,
                host=host,
            )
        change = WorkloadChangeOut(
            seq=seq,
            workload_id=event.workload_id,
            kind=event.kind,
            state=event.state,
            reason=event.reason,
            at=event.at,
            placement=placement,
            request_id=event.request_id or None,
        )
        return frame(event=CHANGE, id=seq, data=change.model_dump_json())

    async def _host(self, machine: str) -> HostOut | None:
        """The host note of a machine the workload was placed on (read once per stream)."""
        if machine not in self._hosts:
            stmt = (
                sa.select(m.machines.c.owner_tenant_id, m.tenants.c.name)
                .join(m.tenants, m.tenants.c.id == m.machines.c.owner_tenant_id)
                .where(m.machines.c.id == machine)
            )
            row = await self._query(lambda conn: conn.execute(stmt).first())
            host = None
            if row is not None and row.owner_tenant_id != self.principal.tenant_id:
                host = _host_note(machine, row.name)
            self._hosts[machine] = host
        return self._hosts[machine]

    async def close(self) -> None:
        """Stop its consumer and give its place back (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._ending.set()
        sub, self._sub = self._sub, None
        if sub is not None:
            with outlived(nats.errors.Error):
                await sub.unsubscribe()
            # Ephemeral consumers go when no one listens; deleting it frees the server at once.
            with outlived(nats.errors.Error):
                await self.hub.js.delete_consumer(names.EVENTS.name, sub._consumer)
        self.hub._release(self)


class EventStreamResponse(StreamingResponse):
    """A stream's frames as `text/event-stream`; the stream is closed however the response
    ends (finished, the client gone, or never sent at all)."""

    media_type = MEDIA_TYPE

    def __init__(self, stream: EventStream, status_code: int = 200) -> None:
        super().__init__(
            stream.frames(),
            status_code=status_code,
            # No cache, and no buffering in a proxy (nginx's header) that would hold events.
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.stream.close()


def _subject_of(event: WorkloadEvent) -> str | None:
    try:
        return names.event_subject(event.workload_id)
    except ValueError:
        return None


# --- the snapshot, from the store ---------------------------------------------------------------

_host_tenant = m.tenants.alias("host")


def _snapshot_of(stream: EventStream) -> sa.Select[Any]:
    """Each followed workload with its latest timeline entry and its machine's owner, in one
    statement (one snapshot of the store)."""
    w, t = m.workloads.c, m.timeline.c
    mine = [w.tenant_id == stream.principal.tenant_id]
    if stream.workload_id is not None:
        mine.append(w.id == stream.workload_id)
    else:
        # A removed workload changes no more; a tenant's list of them only grows.
        mine.append(w.state != WorkloadState.removed.value)
    ranked = (
        sa.select(
            t.workload_id,
            t.at,
            t.kind,
            t.reason,
            t.request_id,
            sa.func.row_number()
            .over(partition_by=t.workload_id, order_by=(t.at.desc(), t.id.desc()))
            .label("rank"),
        )
        .join(m.workloads, w.id == t.workload_id)
        .where(*mine)
        .subquery()
    )
    r = ranked.c
    return (
        sa.select(
            w.id,
            w.tenant_id,
            w.state,
            w.region,
            w.class_name,
            w.placed_region,
            w.placed_machine,
            w.placed_class,
            w.last_seq,
            w.updated_at,
            r.at,
            r.kind,
            r.reason,
            r.request_id,
            m.machines.c.owner_tenant_id.label("host_tenant_id"),
            _host_tenant.c.name.label("host_tenant_name"),
        )
        .select_from(m.workloads)
        .outerjoin(ranked, sa.and_(r.workload_id == w.id, r.rank == 1))
        .outerjoin(m.machines, m.machines.c.id == w.placed_machine)
        .outerjoin(_host_tenant, _host_tenant.c.id == m.machines.c.owner_tenant_id)
        .where(*mine)
        .order_by(w.id)
    )


def _host_note(machine: str, owner_tenant: str) -> HostOut:
    return HostOut(
        machine=machine,
        owner_tenant=owner_tenant,
        note=f"runs on {machine} owned by {owner_tenant}, who can see its data",
    )


def _snapshot_item(r: Mapping[str, Any], seq: int) -> WorkloadChangeOut:
    placement = None
    if r["placed_machine"] is not None:
        host = None
        owner, name = r["host_tenant_id"], r["host_tenant_name"]
        if owner is not None and owner != r["tenant_id"] and name is not None:
            host = _host_note(r["placed_machine"], name)
        placement = PlacementOut(
            region=r["placed_region"] or r["region"],
            machine=r["placed_machine"],
            placed_class=r["placed_class"] or r["class_name"],
            host=host,
        )
    return WorkloadChangeOut.model_validate(
        {
            "seq": seq,
            "workload_id": r["id"],
            "kind": r["kind"] or "transition",
            "state": r["state"],
            "reason": r["reason"] or "",
            "at": r["at"] or r["updated_at"],
            "placement": placement,
            "request_id": r["request_id"],
        }
    )
