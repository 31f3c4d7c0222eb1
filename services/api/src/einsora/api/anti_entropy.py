"""Anti-entropy: what the api's store says is in flight is on the bus, or is put back there.

At start, on a period, and after every reconnect to NATS, one pass (ADR-0011):

1. the bus: every stream the api provisions must exist (a NATS that came back empty, or whose
   streams were deleted, has none); if one is missing, `provision` runs again, and the timeline
   consumer is declared again when its durable is gone;
2. the intents: each workload waiting on an intent (pending, parking, removing: states the api
   records itself and only the scheduler's events move on), unchanged for a period, must have
   its latest intent on its subject in INTENTS. One direct get of the subject's last message
   tells. If the intent is not there (purged, lost with a wiped server, or never stored although
   the relay saw it acked), its outbox rows after the last one INTENTS still holds are published
   again, and the timeline gets a note that says so.

A republished intent keeps its `intent_id`: the scheduler applies an intent id once
(`processed_intents`), so it applies one it never got and ignores one it did; a new id would
make it act twice. The `Nats-Msg-Id` is the intent id, as the relay sets it, so a republish
racing the relay or another replica is dropped by JetStream. JetStream's duplicate window
(300 s) outlives a purge, though: when it answers "duplicate" for a message it no longer holds,
the intent is published once more with `<intent id>.after.<seq of the lost message>`, the same
id for every replica that repairs the same loss.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import nats.errors
import sqlalchemy as sa
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from einsora.api import models as m
from einsora.api.consumers.outbox import AWAITING_INTENT
from einsora.api.consumers.timeline import TimelineConsumer
from einsora.api.services.timeline import add_note
from einsora.api.store import Store
from einsora.common.bus import message_headers, names, provision
from einsora.common.bus.provision import ALL_BUT_ROUTES
from einsora.common.errors import BusUnavailable
from einsora.common.repair import RepairLoop
from einsora.common.schemas import WorkloadIntent, utcnow

log = logging.getLogger("einsora.api.anti_entropy")

ANTI_ENTROPY_PERIOD_S = 60.0
"""How often a pass runs when nothing else asks for one (a reconnect runs one at once)."""

CHUNK = 256
"""Waiting workloads looked at per store read."""

CONCURRENT_GETS = 32
"""Direct gets in flight at once during a pass."""


@dataclass(frozen=True)
class Repair:
    """One workload whose intents were published again."""

    workload_id: str
    actions: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class _Waiting:
    workload_id: str
    state: str
    subject: str


class AntiEntropy:
    """Compares the store with the bus and repairs the bus (see the module's docstring).

    `passes` counts completed passes, `checked` the workloads looked up on the bus, `repairs`
    holds every workload repaired, and `reprovisioned` counts the passes that found a stream
    missing (for tests and operators' logs).
    """

    def __init__(
        self,
        store: Store,
        nc: NATS,
        js: JetStreamContext,
        *,
        timeline: TimelineConsumer | None = None,
        period_s: float = ANTI_ENTROPY_PERIOD_S,
        ack_timeout_s: float = 5.0,
        replicas: int = 1,
    ) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be positive")
        self._store = store
        self._nc = nc
        self._js = js
        self._replicas = replicas
        self._timeline = timeline
        self._period_s = period_s
        self._ack_timeout_s = ack_timeout_s
        self._loop = RepairLoop(
            nc,
            self.run_once,
            what="anti-entropy",
            period_s=period_s,
            failures=(nats.errors.Error, SQLAlchemyError),
        )
        self.passes = 0
        self.checked = 0
        self.repairs: list[Repair] = []
        self.reprovisioned = 0

    async def start(self) -> None:
        """Run a first pass now (in the background) and then as `RepairLoop` says: on the
        period, at once after a reconnect, soon after a failure."""
        await self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def run_once(self) -> list[Repair]:
        """One pass: the bus, then the intents; the workloads repaired. Raises when the store or
        NATS fails (the next pass tries again)."""
        if not self._nc.is_connected:
            raise BusUnavailable("not connected to NATS")
        await self.check_bus()
        repairs = await self.check_intents()
        self.passes += 1
        return repairs

    async def check_bus(self) -> bool:
        """Provision again if a stream is gone, and redeclare the timeline's durable if it is;
        True when something was repaired."""
        missing = []
        for stream in ALL_BUT_ROUTES:
            try:
                await self._js.stream_info(stream)
            except NotFoundError:
                missing.append(stream)
        repaired = False
        if missing:
            report = await provision(self._js, replicas=self._replicas, only=ALL_BUT_ROUTES)
            self.reprovisioned += 1
            repaired = True
            log.warning(
                "streams were missing from NATS (a server that came back empty?); provisioned "
                "them again: %s",
                ", ".join(missing),
                extra={"missing": missing, "streams_created": list(report.created)},
            )
        if self._timeline is not None and await self._timeline.restart_if_gone():
            repaired = True
            log.warning(
                "the timeline consumer's durable was gone from NATS; declared it again, and the "
                "timeline catches up from what EVENTS still holds"
            )
        return repaired

    async def check_intents(self) -> list[Repair]:
        """Publish again the intents of waiting workloads that INTENTS no longer holds."""
        repairs: list[Repair] = []
        after = ""
        w = m.workloads.c
        # A workload changed within the last period has its intent in flight still (or the
        # relay's retries): leave it to the next pass, which keeps a burst of launches cheap.
        settled = utcnow() - timedelta(seconds=self._period_s)
        while True:
            async with self._store.read() as conn:
                found = (
                    await conn.execute(
                        sa.select(w.id, w.region, w.current_region, w.state)
                        .where(
                            w.state.in_(sorted(s.value for s in AWAITING_INTENT)),
                            w.updated_at < settled,
                            w.id > after,
                        )
                        .order_by(w.id)
                        .limit(CHUNK)
                    )
                ).all()
            if not found:
                return repairs
            after = found[-1].id
            waiting = list(_waiting(found))
            # The bus first, then the outbox: a row the relay sends meanwhile is then in the
            # outbox when it is on the bus, and is never taken for a lost one.
            last = await self._last_intents([x.subject for x in waiting])
            self.checked += len(waiting)
            rows = await self._rows([x.subject for x in waiting])
            for item in waiting:
                repair = await self._repair(
                    item, last.get(item.subject), rows.get(item.subject, [])
                )
                if repair is not None:
                    repairs.append(repair)
            if len(found) < CHUNK:
                return repairs

    async def _last_intents(self, subjects: Sequence[str]) -> dict[str, str | None]:
        """The intent id of the last message on each subject in INTENTS (None: none there)."""
        gate = asyncio.Semaphore(CONCURRENT_GETS)

        async def one(subject: str) -> tuple[str, str | None]:
            async with gate:
                return subject, await self._last_intent(subject)

        return dict(await asyncio.gather(*(one(s) for s in subjects)))

    async def _last_intent(self, subject: str) -> str | None:
        try:
            msg = await self._js.get_last_msg(names.INTENTS.name, subject, direct=True)
        except NotFoundError:
            return None
        try:
            return WorkloadIntent.from_bytes(msg.data or b"").intent_id
        except ValidationError:
            return None  # not one of ours: whatever the api wrote is not there

    async def _rows(self, subjects: Sequence[str]) -> dict[str, list[Any]]:
        o = m.outbox.c
        async with self._store.read() as conn:
            result = await conn.execute(
                sa.select(o.intent_id, o.subject, o.payload, o.request_id, o.traceparent, o.sent_at)
                .where(o.subject.in_(subjects))
                .order_by(o.id)
            )
            by_subject: dict[str, list[Any]] = {}
            for row in result:
                by_subject.setdefault(row.subject, []).append(row)
        return by_subject

    async def _repair(self, item: _Waiting, last: str | None, rows: list[Any]) -> Repair | None:
        if not rows:
            # Written before the outbox kept a waiting workload's rows: nothing to publish.
            log.warning(
                "a waiting workload has no intent left in the outbox to publish again",
                extra={"workload_id": item.workload_id, "state": item.state},
            )
            return None
        if any(r.sent_at is None for r in rows):
            return None  # the relay has yet to publish: not lost
        ids = [r.intent_id for r in rows]
        if last == ids[-1]:
            return None  # the latest is on the bus: the scheduler has it or will
        missing = rows[ids.index(last) + 1 :] if last in ids else rows
        for row in missing:
            await self._publish(row)
        actions = tuple(_action(r.payload) for r in missing)
        reason = (
            f"its intent{'s' if len(actions) > 1 else ''} to {_and(actions)} "
            f"{'were' if len(actions) > 1 else 'was'} no longer on the bus; published again"
        )
        async with self._store.write() as conn:
            await add_note(conn, item.workload_id, item.state, reason)
        repair = Repair(item.workload_id, actions, reason)
        self.repairs.append(repair)
        log.warning(
            "intents republished: %s",
            reason,
            extra={
                "workload_id": item.workload_id,
                "state": item.state,
                "intent_ids": [r.intent_id for r in missing],
            },
        )
        return repair

    async def _publish(self, row: Any) -> None:
        headers = message_headers(
            request_id=row.request_id, msg_id=row.intent_id, traceparent=row.traceparent
        )
        data = row.payload.encode()
        ack = await self._js.publish(
            row.subject, data, headers=headers, timeout=self._ack_timeout_s
        )
        if not ack.duplicate:
            return
        # JetStream still remembers the id (its window outlives a purge). Unless the intent has
        # just arrived (the relay or another replica), it remembers a message it no longer has.
        if await self._last_intent(row.subject) == row.intent_id:
            return
        headers[names.MSG_ID_HEADER] = f"{row.intent_id}.after.{ack.seq}"
        await self._js.publish(row.subject, data, headers=headers, timeout=self._ack_timeout_s)


def _waiting(found: Iterable[Any]) -> Iterable[_Waiting]:
    for r in found:
        try:
            # The region that holds it now: a region step handed it over (ADR-0022).
            subject = names.intent_subject(r.current_region or r.region, r.id)
        except ValueError:
            continue  # never published either: the api refuses such regions
        yield _Waiting(r.id, r.state, subject)


def _action(payload: str) -> str:
    try:
        return str(json.loads(payload)["action"])
    except (ValueError, KeyError, TypeError):
        return "act"


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
