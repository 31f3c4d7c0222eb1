"""The bus's own record of a run, and what accounting and the api hold at its end.

The `machines` bucket keeps one value per key, so before anything writes it the harness makes
a mirror of its stream (`CHAOS_MACHINES`, R3, no limits): every desired value, observed report
and leader heartbeat the bucket ever stored stays there, in the bucket's own sequence (a mirror
keeps it), with the time the bucket stored it. A mirror that fell behind while an origin value
was replaced would miss it: the sequences it lacks are counted (`Record.mirror_gaps`). EVENTS
keeps every event itself. Accounting is read where it keeps its truth (its allocations table)
and asked for its usage report as the api asks it (`accounting.report`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats.errors
import sqlalchemy as sa
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
)
from nats.js.errors import APIError, ServiceUnavailableError
from sqlalchemy.ext.asyncio import create_async_engine
from tests.chaos.model import (
    Allocation,
    DesiredValue,
    Event,
    LeaderBeat,
    Record,
    Report,
    Row,
    Usage,
)

from einsora.common.bus import bind_bucket, names, provision
from einsora.common.schemas import (
    DesiredState,
    EventKind,
    LeaderLease,
    ReportGroup,
    UsageReportReply,
    UsageReportRequest,
    WorkloadEvent,
)

MIRROR = "CHAOS_MACHINES"
"""The harness's mirror of the `machines` bucket's stream."""
PROBE_REGION = "chaos-probe"
"""A region no scheduler serves: its heartbeat key proves the mirror is live before a run."""
_KV_OPERATION = "KV-Operation"


async def provision_and_mirror(js: JetStreamContext, within_s: float = 60.0) -> None:
    """Once the cluster's JetStream answers: every stream and bucket (R3), then the mirror,
    live before anything else writes the bucket."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            await provision(js, replicas=3)
            break
        except (ServiceUnavailableError, APIError, nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)
    await js.add_stream(
        StreamConfig(
            name=MIRROR,
            description="The chaos harness's record of every value of the machines bucket.",
            mirror=StreamSource(name=names.MACHINES.stream),
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            num_replicas=3,
        )
    )
    kv = bind_bucket(js, names.MACHINES)
    probe = LeaderLease(region=PROBE_REGION, holder="chaos", term=1)
    await kv.put(names.leader_heartbeat_key(PROBE_REGION), probe.to_bytes())
    while (await js.stream_info(MIRROR)).state.messages < 1:
        if time.monotonic() > deadline:
            raise AssertionError("the machines bucket's mirror took nothing in")
        await asyncio.sleep(0.05)


async def read_stream(js: JetStreamContext, stream: str, within_s: float = 120.0) -> list[Msg]:
    """Every message `stream` holds now, in order; a consumer that fails (its stream's leader
    moved, say) is made again from where it was."""
    deadline = time.monotonic() + within_s
    last = (await js.stream_info(stream)).state.last_seq
    found: list[Msg] = []
    while not found or found[-1].metadata.sequence.stream < last:
        start = found[-1].metadata.sequence.stream + 1 if found else 1
        try:
            sub = await js.pull_subscribe(
                "",
                stream=stream,
                config=ConsumerConfig(
                    ack_policy=AckPolicy.NONE,
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=start,
                    inactive_threshold=60.0,
                ),
            )
        except _BUS_ERRORS:
            await _retry(deadline, f"reading {stream}")
            continue
        try:
            while not found or found[-1].metadata.sequence.stream < last:
                found.extend(await sub.fetch(1000, timeout=5))
        except _BUS_ERRORS:
            await _retry(deadline, f"reading {stream}")
        finally:
            with contextlib.suppress(*_BUS_ERRORS):
                await sub.unsubscribe()
    return found


_BUS_ERRORS = (ServiceUnavailableError, APIError, nats.errors.Error, TimeoutError)


async def _retry(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise AssertionError(f"gave up {what}")
    await asyncio.sleep(0.5)


async def mirror_caught_up(js: JetStreamContext, within_s: float = 60.0) -> None:
    """Wait until the mirror holds the bucket's last message."""
    deadline = time.monotonic() + within_s
    target = (await js.stream_info(names.MACHINES.stream)).state.last_seq
    while (await js.stream_info(MIRROR)).state.last_seq < target:
        if time.monotonic() > deadline:
            raise AssertionError(f"the mirror did not reach the bucket's sequence {target}")
        await asyncio.sleep(0.2)


def read_machines(messages: Iterable[Msg], record: Record) -> None:
    """The mirror's messages as desired values, reports and leader heartbeats."""
    previous: tuple[int, float] | None = None
    for msg in messages:
        seq = msg.metadata.sequence.stream
        at = _epoch(msg.metadata.timestamp)
        if previous is not None and seq > previous[0] + 1:
            record.mirror_gaps += seq - previous[0] - 1
            record.mirror_gap_spans.append((previous[1], at, seq - previous[0] - 1))
        previous = (seq, at)
        key = msg.subject.removeprefix(names.MACHINES.subject_prefix)
        deleted = bool(msg.headers and msg.headers.get(_KV_OPERATION)) or not msg.data
        if key.startswith(f"{names.LEADER_KEY_PREFIX}.") and key.endswith(".heartbeat"):
            if not deleted:
                beat = LeaderLease.from_bytes(msg.data)
                record.leader.append(
                    LeaderBeat(seq, at, beat.region, beat.holder, beat.term, beat.released)
                )
            continue
        machine, _, kind = key.rpartition(".")
        if kind == "observed" and not deleted:
            record.reports.append(Report(seq, at, machine))
        elif kind == "desired":
            record.desired.append(_desired(seq, at, machine, None if deleted else msg.data))


def _desired(seq: int, at: float, machine: str, data: bytes | None) -> DesiredValue:
    if data is None:
        return DesiredValue(seq, at, machine, -1, deleted=True)
    state = DesiredState.from_bytes(data)
    rows = tuple(
        Row(w.workload_id, w.target.value, tuple(w.resources.gpus)) for w in state.workloads
    )
    return DesiredValue(seq, at, machine, state.generation, rows)


def read_events(messages: Iterable[Msg], record: Record) -> None:
    for msg in messages:
        e = WorkloadEvent.from_bytes(msg.data)
        held = e.metered
        machine = e.placement.machine if e.placement else held.machine if held else None
        record.events.append(
            Event(
                stream_seq=msg.metadata.sequence.stream,
                published=_epoch(msg.metadata.timestamp),
                event_id=e.event_id,
                workload=e.workload_id,
                seq=e.seq,
                transition=e.kind is EventKind.transition,
                state=e.state.value,
                reason=e.reason,
                at=e.at.timestamp(),
                machine=machine,
                gpus=len(held.gpus) if held else 0,
                cpus=float(held.cpus) if held else 0.0,
                metered=held is not None,
            )
        )


async def read_accounting(database_url: str) -> list[Allocation]:
    """Accounting's allocations, from its own table."""
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text(
                        "SELECT workload_id, opened_by_event, closed_by_event, started_at, "
                        "ended_at, gpu_count, cpus FROM accounting_allocations"
                    )
                )
            ).all()
    finally:
        await engine.dispose()
    return [
        Allocation(
            workload=r.workload_id,
            opened_by=r.opened_by_event,
            started_at=_epoch(r.started_at),
            gpus=int(r.gpu_count),
            cpus=float(r.cpus),
            closed_by=r.closed_by_event,
            ended_at=None if r.ended_at is None else _epoch(r.ended_at),
        )
        for r in rows
    ]


async def accounting_caught_up(database_url: str, events: list[Event]) -> bool:
    """Whether accounting has applied each workload's last transition (its `last_seq`)."""
    last: dict[str, int] = {}
    for e in events:
        if e.transition:
            last[e.workload] = max(e.seq, last.get(e.workload, -1))
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text("SELECT workload_id, last_seq FROM accounting_workloads")
                )
            ).all()
    except sa.exc.DBAPIError:
        return False
    finally:
        await engine.dispose()
    applied = {r.workload_id: int(r.last_seq) for r in rows}
    return all(applied.get(w, -1) >= s for w, s in last.items())


async def read_usage(nc: NATS, workloads: list[str], since: float, now: float) -> dict[str, Usage]:
    """Accounting's usage report by workload, open allocations counted to `now`."""
    usage: dict[str, Usage] = {}
    start = datetime.fromtimestamp(since, tz=UTC) - timedelta(hours=1)
    moment = datetime.fromtimestamp(now, tz=UTC)
    for i in range(0, len(workloads), 2000):
        request = UsageReportRequest(
            workload_ids=workloads[i : i + 2000],
            group_by=ReportGroup.workload,
            start=start,
            end=moment + timedelta(seconds=1),
            now=moment,
        )
        msg = await nc.request(names.ACCOUNTING_REPORT_SUBJECT, request.to_bytes(), timeout=30)
        reply = UsageReportReply.from_bytes(msg.data)
        if reply.error is not None or reply.truncated:
            raise AssertionError(f"accounting's report: {reply.error or 'truncated'}")
        for item in reply.items:
            usage[item.group] = Usage(item.gpu_hours, item.cpu_core_hours)
    return usage


def save(record: Record, path: Path) -> None:
    """The record as JSON, for a look at a failed run after the fact."""
    path.write_text(json.dumps(dataclasses.asdict(record), default=str))


def _epoch(moment: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
