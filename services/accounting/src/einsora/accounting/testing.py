"""Players of the services around accounting, for its tests and benchmarks: the scheduler
publishing workload events and the gateway publishing token counts on a real bus, as they do,
and waits for accounting to have taken everything in. Never a mock of accounting itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from einsora.accounting.service import EVENTS_CONSUMER, TOKENS_CONSUMER
from einsora.common.bus import names, publish
from einsora.common.ids import new_id
from einsora.common.schemas import (
    CountSource,
    EventKind,
    Metered,
    TokenUsage,
    UsageReportReply,
    UsageReportRequest,
    WorkloadEvent,
    WorkloadKind,
    WorkloadState,
)

T0 = datetime(2030, 3, 4, 21, 15, 30, 250_000, tzinfo=UTC)
"""An instant far from the wall clock, so a time taken from anything but the event shows."""


def held(
    gpus: int = 2,
    *,
    machine: str = "m-1",
    placed_class: str = "l40s-48gb",
    region: str = "local",
    cpus: float = 8.0,
    memory_mib: int = 65536,
    kind: WorkloadKind = WorkloadKind.notebook,
) -> Metered:
    """What a placed workload holds, as the scheduler's events carry it."""
    return Metered(
        kind=kind,
        class_name=placed_class,
        placed_class=placed_class,
        region=region,
        machine=machine,
        gpus=[f"GPU-{machine}-{i}" for i in range(gpus)],
        cpus=cpus,
        memory_mib=memory_mib,
    )


class SchedulerPlayer:
    """Publishes workload events on EVENTS as the scheduler does (`Nats-Msg-Id` = event id,
    `event_id` = `<workload>-<seq>`), numbering each workload's events."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.seq: dict[str, int] = defaultdict(int)

    def event(
        self,
        workload_id: str,
        state: WorkloadState | str,
        at: datetime,
        *,
        tenant_id: str = "t-a",
        metered: Metered | None = None,
        kind: EventKind = EventKind.transition,
        seq: int | None = None,
    ) -> WorkloadEvent:
        if seq is None:
            self.seq[workload_id] += 1
            seq = self.seq[workload_id]
        return WorkloadEvent(
            event_id=f"{workload_id}-{seq}",
            workload_id=workload_id,
            tenant_id=tenant_id,
            kind=kind,
            state=WorkloadState(state),
            reason=f"now {state}",
            seq=seq,
            at=at,
            metered=metered,
        )

    async def send(self, event: WorkloadEvent, *, msg_id: str | None = None) -> None:
        await publish(
            self.js,
            names.event_subject(event.workload_id),
            event,
            request_id=new_id("request"),
            msg_id=msg_id or event.event_id,
        )

    async def transition(
        self, workload_id: str, state: WorkloadState | str, at: datetime, **kwargs: Any
    ) -> WorkloadEvent:
        event = self.event(workload_id, state, at, **kwargs)
        await self.send(event)
        return event

    async def run_for(
        self,
        workload_id: str,
        start: datetime,
        end: datetime | None,
        *,
        tenant_id: str = "t-a",
        metered: Metered | None = None,
        until_state: WorkloadState = WorkloadState.parking,
    ) -> None:
        """The workload runs from `start` to `end` (None: still running)."""
        await self.transition(
            workload_id,
            WorkloadState.running,
            start,
            tenant_id=tenant_id,
            metered=metered or held(),
        )
        if end is not None:
            await self.transition(
                workload_id, until_state, end, tenant_id=tenant_id, metered=metered or held()
            )


class GatewayPlayer:
    """Publishes token counts on `usage.tokens.<tenant>` as the gateway does."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js

    def usage(
        self,
        at: datetime,
        *,
        tenant_id: str = "t-a",
        key_id: str = "gk-1",
        prompt: int = 10,
        completion: int = 5,
        endpoint: str = "w-endpoint",
        model: str = "tiny",
        source: CountSource = CountSource.upstream,
    ) -> TokenUsage:
        return TokenUsage(
            request_id=new_id("request"),
            tenant_id=tenant_id,
            key_id=key_id,
            endpoint=endpoint,
            model=model,
            prompt_tokens=prompt,
            completion_tokens=completion,
            source=source,
            at=at,
        )

    async def send(self, usage: TokenUsage, *, msg_id: str | None = None) -> None:
        await publish(
            self.js,
            names.usage_tokens_subject(usage.tenant_id),
            usage,
            request_id=usage.request_id,
            msg_id=msg_id or usage.request_id,
        )


async def caught_up(js: JetStreamContext, durable: str, within_s: float = 20.0) -> None:
    """Wait until accounting's durable consumer has every message of its stream acknowledged."""
    stream = names.EVENTS.name if durable == EVENTS_CONSUMER else names.USAGE.name
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        with contextlib.suppress(NotFoundError):
            info = await js.consumer_info(stream, durable)
            # `num_pending` can lag a message just published; the ack floor cannot. Every
            # message of EVENTS is accounting's, so its floor must reach the stream's last.
            last = (
                (await js.stream_info(stream)).state.last_seq if stream == names.EVENTS.name else 0
            )
            floor = (info.ack_floor.stream_seq or 0) if info.ack_floor is not None else 0
            if info.num_pending == 0 and info.num_ack_pending == 0 and floor >= last:
                return
        if loop.time() > deadline:
            raise AssertionError(f"{durable} did not catch up within {within_s} s")
        await asyncio.sleep(0.02)


async def events_done(js: JetStreamContext, within_s: float = 20.0) -> None:
    """Until accounting has taken in every workload event published so far."""
    await caught_up(js, EVENTS_CONSUMER, within_s)


async def tokens_done(js: JetStreamContext, within_s: float = 20.0) -> None:
    """Until accounting has taken in every token count published so far."""
    await caught_up(js, TOKENS_CONSUMER, within_s)


async def ask_report(nc: NATS, request: UsageReportRequest | bytes) -> UsageReportReply:
    """Ask `accounting.report` as the api does."""
    data = request if isinstance(request, bytes) else request.to_bytes()
    reply = await nc.request(names.ACCOUNTING_REPORT_SUBJECT, data, timeout=10)
    return UsageReportReply.from_bytes(reply.data)


def hours(n: float) -> timedelta:
    return timedelta(hours=n)
