"""The workload export (`einsora.workload-export/v1`): the workload as submitted, its
placements and complete timeline from the store, its usage from accounting, every secret
redacted by `einsora.common.redaction` and every redaction listed.

The caller sees what they may see elsewhere: another tenant's workload is a 404, and a member
gets the usage of their own workloads only (as `GET /v1/usage` answers). What the export cannot
hold (no accounting, or usage that is not the caller's to see) is said in `notes`, never left
out silently.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Unavailable
from einsora.api.schemas.export import (
    AllocationSumOut,
    ExportedWorkloadOut,
    ExportUsageOut,
    PlacementEntryOut,
    TokenCountOut,
    WorkloadExportOut,
)
from einsora.api.schemas.workloads import TimelineEntryOut, WorkloadOut
from einsora.api.services import workloads
from einsora.api.services.usage import Accounting, scope_of
from einsora.api.store import Store
from einsora.common.redaction import redact
from einsora.common.schemas import (
    EventKind,
    ReportGroup,
    UsageItem,
    UsageReportRequest,
    WorkloadKind,
)
from einsora.common.schemas.usage import split_key_source

MAX_USAGE_DAYS = 3650
"""The longest history of usage an export asks accounting for (it answers up to ten years)."""

# Entries from before the timeline kept placements (migration 0014) name their machine only in
# the reason, where the scheduler's placement reasons all start so (scheduler/reasons.py).
_PLACED = re.compile(r"^placed on (?P<machine>[^\s,;()]+)")


async def export(
    store: Store,
    accounting: Accounting | None,
    principal: Principal,
    workload_id: str,
    now: datetime,
) -> WorkloadExportOut:
    """The export of one of the caller's tenant's workloads (404 for any other)."""
    workload = await workloads.get(store, principal, workload_id)
    t = m.timeline.c
    stmt = (
        sa.select(
            t.at,
            t.kind,
            t.state,
            t.reason,
            t.request_id,
            t.placed_region,
            t.placed_machine,
            t.placed_class,
        )
        .where(t.workload_id == workload.id)
        .order_by(t.at, t.id)
    )
    async with store.read() as conn:
        rows = (await conn.execute(stmt)).all()
        scope = await scope_of(conn, principal, None)
    timeline = [TimelineEntryOut.model_validate(r, from_attributes=True) for r in rows]
    placements = [p for p in (_placement(r) for r in rows) if p is not None]
    notes: list[str] = []
    usage: ExportUsageOut | None = None
    if accounting is None:
        notes.append("usage is left out: it comes from accounting, and this api has no bus")
    elif scope.workload_ids is not None and workload.id not in scope.workload_ids:
        notes.append("usage is left out: a member sees the usage of their own workloads only")
    else:
        try:
            usage = await _usage(store, accounting, workload, now)
        except Unavailable as exc:
            notes.append(f"usage is left out: {exc}")
    return assemble(workload, timeline, placements, usage, notes, now)


def assemble(
    workload: WorkloadOut,
    timeline: list[TimelineEntryOut],
    placements: list[dict[str, Any]],
    usage: ExportUsageOut | None,
    notes: list[str],
    now: datetime,
) -> WorkloadExportOut:
    """The document, redacted: the workload, its placements and its timeline are what users
    and machines wrote, and are redacted; usage is accounting's figures and our own ids."""
    inputs, found = redact(workload.model_dump(mode="json", by_alias=True), "$.workload")
    entries = [e.model_dump(mode="json") for e in timeline]
    placements, more = redact(placements, "$.placement_history")
    entries, most = redact(entries, "$.timeline")
    return WorkloadExportOut(
        exported_at=now,
        workload=ExportedWorkloadOut.model_validate(inputs),
        placement_history=[PlacementEntryOut.model_validate(p) for p in placements],
        timeline=[TimelineEntryOut.model_validate(e) for e in entries],
        usage=usage,
        notes=notes,
        redactions=[*found, *more, *most],
    )


def _placement(row: Any) -> dict[str, Any] | None:
    """The placement a timeline row records (None: it placed nothing)."""
    if row.kind != EventKind.transition.value:
        return None
    machine = row.placed_machine
    if machine is None:
        match = _PLACED.match(row.reason)
        if match is None:
            return None
        machine = match["machine"]
    return {
        "at": row.at.isoformat(),
        "state": row.state,
        "region": row.placed_region,
        "machine": machine,
        "placed_class": row.placed_class,
        "reason": row.reason,
    }


async def _usage(
    store: Store, accounting: Accounting, workload: WorkloadOut, now: datetime
) -> ExportUsageOut:
    """The workload's allocations from its launch to now, in total, by day and by class; and,
    for an endpoint, the tokens it and its replicas served, by key and count source."""
    start = max(workload.created_at, now - timedelta(days=MAX_USAGE_DAYS))
    end = max(now, start + timedelta(seconds=1))  # a window is never empty
    serves = workload.kind is WorkloadKind.endpoint

    def ask(group: ReportGroup, endpoint_ids: list[str] | None = None) -> UsageReportRequest:
        by_key = group is ReportGroup.key_source
        return UsageReportRequest(
            tenant_ids=[workload.tenant_id],
            workload_ids=None if by_key else [workload.id],
            # The allocation groups count no tokens: those come by key and source.
            key_ids=None if by_key else [],
            endpoint_ids=endpoint_ids,
            group_by=group,
            start=start,
            end=end,
            now=now,
        )

    asks = [ask(ReportGroup.workload), ask(ReportGroup.day), ask(ReportGroup.klass)]
    if serves:
        served_by = await _replicas(store, workload)
        asks.append(ask(ReportGroup.key_source, endpoint_ids=served_by))
    total, days, classes, *served = await asyncio.gather(*map(accounting.report, asks))
    tokens = await _tokens(store, workload.tenant_id, served[0].items) if served else []
    mine = [i for i in total.items if i.group == workload.id]
    return ExportUsageOut(
        start=start,
        end=end,
        gpu_hours=sum(i.gpu_hours for i in mine),
        cpu_core_hours=sum(i.cpu_core_hours for i in mine),
        by_day=_sums(days.items),
        by_placed_class=_sums(classes.items),
        tokens=tokens,
        truncated=any(reply.truncated for reply in (total, days, classes, *served)),
    )


async def _replicas(store: Store, workload: WorkloadOut) -> list[str]:
    """The workloads whose tokens are the endpoint's: itself and its replicas (the gateway
    records the replica that answered)."""
    w = m.workloads.c
    async with store.read() as conn:
        replicas = await conn.scalars(sa.select(w.id).where(w.replica_of == workload.id))
        return [workload.id, *sorted(replicas)]


async def _tokens(store: Store, tenant_id: str, items: list[UsageItem]) -> list[TokenCountOut]:
    """Accounting's `<key_id>/<source>` groups, with each key's name (revoked keys too)."""
    counts = sorted(((split_key_source(i.group), i) for i in items), key=lambda c: c[0])
    if not counts:
        return []
    key_ids = sorted({key_id for (key_id, _), _ in counts})
    k = m.gateway_keys.c
    async with store.read() as conn:
        found = await conn.execute(
            sa.select(k.id, k.name).where(k.tenant_id == tenant_id, k.id.in_(key_ids))
        )
        names: dict[str, str] = {key_id: name for key_id, name in found}
    return [
        TokenCountOut(
            key_id=key_id,
            key_name=names.get(key_id),
            source=source,
            prompt_tokens=item.prompt_tokens,
            completion_tokens=item.completion_tokens,
        )
        for (key_id, source), item in counts
    ]


def _sums(items: list[UsageItem]) -> list[AllocationSumOut]:
    return [
        AllocationSumOut(group=i.group, gpu_hours=i.gpu_hours, cpu_core_hours=i.cpu_core_hours)
        for i in sorted(items, key=lambda i: i.group)
        if i.gpu_hours or i.cpu_core_hours
    ]
