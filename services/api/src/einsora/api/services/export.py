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

MAX_USAGE_DAYS = 3650
"""The longest history of usage an export asks accounting for (it answers up to ten years)."""

# The scheduler's placement reasons all start so (scheduler/reasons.py); the timeline keeps
# the reason, not the placement, so the machine is read back from it.
_PLACED = re.compile(r"^placed on (?P<machine>[^\s,;()]+)")

TOKENS_NOT_REPORTED = (
    "token counts are left out: accounting's report does not yet filter tokens by the endpoint "
    "that served them"
)


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
        sa.select(t.at, t.kind, t.state, t.reason, t.request_id)
        .where(t.workload_id == workload.id)
        .order_by(t.at, t.id)
    )
    async with store.read() as conn:
        rows = (await conn.execute(stmt)).all()
        scope = await scope_of(conn, principal, None)
    timeline = [TimelineEntryOut.model_validate(r, from_attributes=True) for r in rows]
    notes: list[str] = []
    usage: ExportUsageOut | None = None
    if accounting is None:
        notes.append("usage is left out: it comes from accounting, and this api has no bus")
    elif scope.workload_ids is not None and workload.id not in scope.workload_ids:
        notes.append("usage is left out: a member sees the usage of their own workloads only")
    else:
        try:
            usage = await _usage(accounting, workload, now)
        except Unavailable as exc:
            notes.append(f"usage is left out: {exc}")
    if usage is not None and usage.tokens is None:
        notes.append(TOKENS_NOT_REPORTED)
    return assemble(workload, timeline, usage, notes, now)


def assemble(
    workload: WorkloadOut,
    timeline: list[TimelineEntryOut],
    usage: ExportUsageOut | None,
    notes: list[str],
    now: datetime,
) -> WorkloadExportOut:
    """The document, redacted: the workload, its placements and its timeline are what users
    and machines wrote, and are redacted; usage is accounting's figures and our own ids."""
    inputs, found = redact(workload.model_dump(mode="json", by_alias=True), "$.workload")
    entries = [e.model_dump(mode="json") for e in timeline]
    placements, more = redact(_placements(timeline), "$.placement_history")
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


def _placements(timeline: list[TimelineEntryOut]) -> list[dict[str, Any]]:
    placed = []
    for entry in timeline:
        match = _PLACED.match(entry.reason)
        if entry.kind is EventKind.transition and match is not None:
            placed.append(
                {
                    "at": entry.at.isoformat(),
                    "state": entry.state.value,
                    "machine": match["machine"],
                    "reason": entry.reason,
                }
            )
    return placed


async def _usage(accounting: Accounting, workload: WorkloadOut, now: datetime) -> ExportUsageOut:
    """The workload's allocations from its launch to now, in total, by day and by class."""
    start = max(workload.created_at, now - timedelta(days=MAX_USAGE_DAYS))
    end = max(now, start + timedelta(seconds=1))  # a window is never empty

    def ask(group: ReportGroup) -> UsageReportRequest:
        return UsageReportRequest(
            tenant_ids=[workload.tenant_id],
            workload_ids=[workload.id],
            key_ids=[],
            group_by=group,
            start=start,
            end=end,
            now=now,
        )

    total, days, classes = await asyncio.gather(
        accounting.report(ask(ReportGroup.workload)),
        accounting.report(ask(ReportGroup.day)),
        accounting.report(ask(ReportGroup.klass)),
    )
    mine = [i for i in total.items if i.group == workload.id]
    return ExportUsageOut(
        start=start,
        end=end,
        gpu_hours=sum(i.gpu_hours for i in mine),
        cpu_core_hours=sum(i.cpu_core_hours for i in mine),
        by_day=_sums(days.items),
        by_placed_class=_sums(classes.items),
        # Only an endpoint serves tokens; accounting cannot yet say which endpoint served them.
        tokens=None if workload.kind is WorkloadKind.endpoint else [],
        truncated=total.truncated or days.truncated or classes.truncated,
    )


def _sums(items: list[UsageItem]) -> list[AllocationSumOut]:
    return [
        AllocationSumOut(group=i.group, gpu_hours=i.gpu_hours, cpu_core_hours=i.cpu_core_hours)
        for i in sorted(items, key=lambda i: i.group)
        if i.gpu_hours or i.cpu_core_hours
    ]
