"""Usage reports: sums of allocations and token counts over [start, end), grouped, in SQL.

- GPU-hours are Σ GPUs × hours of overlap with the range, CPU-core-hours Σ cores × hours;
  an open allocation counts up to the request's `now`. Tokens count where their request's `at`
  falls in the range.
- Groups: `tenant` and `day` (UTC date, allocations split at midnight) sum both; `workload`,
  `class` (the placed class) and `region` sum allocations only (a token is not spent on a class
  or a region, and the endpoint that served it belongs to whoever launched it, not to who sent
  it); `key` sums tokens only, and `endpoint` tokens only, by the replica that served them.
  So the api folds a user's report from their workloads' rows and their keys' rows, and an
  endpoint's from its replicas' workload rows and served rows, without counting anything
  twice. `key_source` sums tokens by key and count source, labelled `<key_id>/<source>` (the
  workload export's tokens).
- Filters: `tenant_ids` (both), `workload_ids` (allocations), `key_ids` and `endpoint_ids`
  (tokens: the key that sent them, the replica that served them); an empty list matches
  nothing, None everything.

Fast whatever the history: whole days come from the day sums (or the day pieces, for a
workload's figures), the partial days at the two edges from the day pieces of those days
alone, open allocations from their own rows (at most one per workload), and tokens likewise
by hour. No query scans more than the range's whole-day sums and two days of pieces.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from einsora.accounting import tables as t
from einsora.accounting.periods import DAY, HOUR, day_of, day_pieces, overlap_s, split
from einsora.common.schemas import (
    MAX_REPORT_ITEMS,
    ReportGroup,
    UsageItem,
    UsageReportReply,
    UsageReportRequest,
)
from einsora.common.schemas.usage import key_source_group

AnySelect = sa.Select[*tuple[Any, ...]]

MAX_FILTER = 10_000
"""Ids one filter may list."""
MAX_RANGE = timedelta(days=3660)
"""The longest range a report may cover (ten years)."""

_G = ReportGroup
_ALLOCATIONS = frozenset({_G.tenant, _G.workload, _G.klass, _G.region, _G.day})
_TOKENS = frozenset({_G.tenant, _G.key, _G.key_source, _G.endpoint, _G.day})
_FROM_DAY_SUMS = frozenset({_G.tenant, _G.klass, _G.region, _G.day})
"""Groups the day sums can answer (they have no workload column)."""


class Sums:
    """One group's running sums."""

    __slots__ = ("completion", "cpu_s", "gpu_s", "prompt")

    def __init__(self) -> None:
        self.gpu_s = 0.0
        self.cpu_s = 0.0
        self.prompt = 0
        self.completion = 0


Groups = defaultdict[str, Sums]


def what_is_wrong(request: UsageReportRequest) -> str | None:
    """Why the request cannot be answered, in words for whoever sent it; None when it can."""
    for name, value in (("from", request.start), ("to", request.end), ("now", request.now)):
        if value.tzinfo is None or value.utcoffset() is None:
            return f"`{name}` must carry a time zone (e.g. 2025-01-01T00:00:00Z)"
    if request.start >= request.end:
        return "`from` must be before `to`"
    if request.end - request.start > MAX_RANGE:
        return f"the range may cover at most {MAX_RANGE.days} days"
    for name, ids in (
        ("tenant_ids", request.tenant_ids),
        ("workload_ids", request.workload_ids),
        ("key_ids", request.key_ids),
        ("endpoint_ids", request.endpoint_ids),
    ):
        if ids is not None and len(ids) > MAX_FILTER:
            return f"`{name}` may list at most {MAX_FILTER:,} ids"
    return None


def report(conn: sa.Connection, request: UsageReportRequest) -> UsageReportReply:
    """The report (a read unit); an error reply for a request that cannot be answered."""
    problem = what_is_wrong(request)
    if problem is not None:
        return UsageReportReply(error=problem)
    groups: Groups = defaultdict(Sums)
    if request.group_by in _ALLOCATIONS:
        allocation_sums(
            conn,
            groups,
            request.group_by,
            request.start,
            request.end,
            request.now,
            tenant_ids=request.tenant_ids,
            workload_ids=request.workload_ids,
        )
    if request.group_by in _TOKENS:
        token_sums(conn, groups, request)
    names = sorted(groups)
    items = [
        UsageItem(
            group=name,
            gpu_hours=groups[name].gpu_s / 3600.0,
            cpu_core_hours=groups[name].cpu_s / 3600.0,
            prompt_tokens=groups[name].prompt,
            completion_tokens=groups[name].completion,
        )
        for name in names[:MAX_REPORT_ITEMS]
    ]
    return UsageReportReply(items=items, truncated=len(names) > MAX_REPORT_ITEMS)


def fitted(reply: UsageReportReply, limit: int) -> bytes:
    """The reply as bytes of at most `limit` (the bus's largest message): the first groups
    that fit, `truncated` set, when all of them do not."""
    data = reply.to_bytes()
    if len(data) <= limit:
        return data
    fits, too_many = 0, len(reply.items)
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        trial = UsageReportReply(items=reply.items[:middle], truncated=True)
        if len(trial.to_bytes()) <= limit:
            fits = middle
        else:
            too_many = middle
    return UsageReportReply(items=reply.items[:fits], truncated=True).to_bytes()


# --- allocations ------------------------------------------------------------------------------


def allocation_sums(
    conn: sa.Connection,
    groups: Groups,
    group_by: ReportGroup,
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    tenant_ids: Sequence[str] | None = None,
    workload_ids: Sequence[str] | None = None,
) -> None:
    """Add GPU- and CPU-core-seconds over [start, end) to `groups` (open allocations up to
    `now`)."""
    days = split(start, end, DAY)
    pieces = t.allocation_days.c
    if days.full is not None:
        first, last = day_of(days.full[0]), day_of(days.full[1])
        if group_by in _FROM_DAY_SUMS and workload_ids is None:
            sums = t.usage_days.c
            group = _group_column(sums, group_by)
            stmt = sa.select(
                group, sa.func.sum(sums.gpu_seconds), sa.func.sum(sums.cpu_core_seconds)
            ).where(sums.day >= first, sums.day < last)
            stmt = _filtered(stmt, sums.tenant_id, tenant_ids)
        else:
            held = pieces.end_s - pieces.start_s
            group = _group_column(pieces, group_by)
            stmt = sa.select(
                group, sa.func.sum(pieces.gpu_count * held), sa.func.sum(pieces.cpus * held)
            ).where(pieces.day >= first, pieces.day < last)
            stmt = _filtered(stmt, pieces.tenant_id, tenant_ids)
            stmt = _filtered(stmt, pieces.workload_id, workload_ids)
        _add_seconds(conn, groups, stmt.group_by(group))
    for lo, hi in days.edges:
        # An edge lies inside one day: only that day's pieces can overlap it.
        day = day_of(lo)
        lo_s, hi_s = _seconds(lo), _seconds(hi)
        held = sa.case((pieces.end_s < hi_s, pieces.end_s), else_=hi_s) - sa.case(
            (pieces.start_s > lo_s, pieces.start_s), else_=lo_s
        )
        sums_of = (sa.func.sum(pieces.gpu_count * held), sa.func.sum(pieces.cpus * held))
        where = (pieces.day == day, pieces.start_s < hi_s, pieces.end_s > lo_s)
        if group_by is ReportGroup.day:
            stmt = sa.select(*sums_of).where(*where)
            stmt = _filtered(stmt, pieces.tenant_id, tenant_ids)
            stmt = _filtered(stmt, pieces.workload_id, workload_ids)
            _add_seconds(conn, groups, stmt, label=day.isoformat())
            continue
        group = _group_column(pieces, group_by)
        stmt = sa.select(group, *sums_of).where(*where)
        stmt = _filtered(stmt, pieces.tenant_id, tenant_ids)
        stmt = _filtered(stmt, pieces.workload_id, workload_ids)
        _add_seconds(conn, groups, stmt.group_by(group))
    _add_open(conn, groups, group_by, start, end, now, tenant_ids, workload_ids)


def _seconds(t_: datetime) -> ColumnElement[float]:
    return sa.literal(t_.timestamp(), sa.Float)


def _group_column(columns: Any, group_by: ReportGroup) -> ColumnElement[Any]:
    name = {
        ReportGroup.tenant: "tenant_id",
        ReportGroup.workload: "workload_id",
        ReportGroup.klass: "placed_class",
        ReportGroup.region: "region",
        ReportGroup.key: "key_id",
        ReportGroup.endpoint: "endpoint",
        ReportGroup.day: "day",
    }[group_by]
    column: ColumnElement[Any] = columns[name]
    return column


def _filtered(stmt: AnySelect, column: ColumnElement[Any], ids: Sequence[str] | None) -> AnySelect:
    return stmt if ids is None else stmt.where(column.in_(list(ids)))


def _label(value: Any) -> str:
    return value if isinstance(value, str) else value.isoformat()


def _add_seconds(
    conn: sa.Connection, groups: Groups, stmt: AnySelect, *, label: str | None = None
) -> None:
    """Add (group, GPU-seconds, core-seconds) rows, or one (GPU-seconds, core-seconds) row
    under `label` (NULL sums: nothing overlapped)."""
    for row in conn.execute(stmt):
        group, gpu_s, cpu_s = (label, *row) if label is not None else row
        if gpu_s is None and cpu_s is None:
            continue
        sums = groups[_label(group)]
        sums.gpu_s += float(gpu_s or 0.0)
        sums.cpu_s += float(cpu_s or 0.0)


def _add_open(
    conn: sa.Connection,
    groups: Groups,
    group_by: ReportGroup,
    start: datetime,
    end: datetime,
    now: datetime,
    tenant_ids: Sequence[str] | None,
    workload_ids: Sequence[str] | None,
) -> None:
    """Open allocations, up to `now`: few (one per running workload), so summed here."""
    upto = min(end, now)
    if upto <= start:
        return
    a = t.allocations.c
    stmt = sa.select(
        a.tenant_id, a.workload_id, a.placed_class, a.region, a.gpu_count, a.cpus, a.started_at
    ).where(a.ended_at.is_(None), a.started_at < upto)
    stmt = _filtered(stmt, a.tenant_id, tenant_ids)
    stmt = _filtered(stmt, a.workload_id, workload_ids)
    for r in conn.execute(stmt):
        lo = max(start, r.started_at)
        if lo >= upto:
            continue
        if group_by is ReportGroup.day:
            spans = [(day.isoformat(), p_lo, p_hi) for day, p_lo, p_hi in day_pieces(lo, upto)]
        else:
            spans = [(_open_group(r, group_by), lo, upto)]
        for group, p_lo, p_hi in spans:
            held = overlap_s(p_lo, p_hi, start, upto)
            sums = groups[group]
            sums.gpu_s += r.gpu_count * held
            sums.cpu_s += r.cpus * held


def _open_group(r: Any, group_by: ReportGroup) -> str:
    value: str = {
        ReportGroup.tenant: r.tenant_id,
        ReportGroup.workload: r.workload_id,
        ReportGroup.klass: r.placed_class,
        ReportGroup.region: r.region,
    }[group_by]
    return value


# --- tokens -----------------------------------------------------------------------------------


def token_sums(conn: sa.Connection, groups: Groups, request: UsageReportRequest) -> None:
    """Add prompt and completion tokens of requests made in [start, end) to `groups`."""
    group_by = request.group_by
    hours = split(request.start, request.end, HOUR)
    if hours.full is not None:
        h = t.token_hours.c
        by = _token_group(h, group_by)
        stmt = sa.select(*by, sa.func.sum(h.prompt_tokens), sa.func.sum(h.completion_tokens)).where(
            h.hour >= hours.full[0], h.hour < hours.full[1]
        )
        stmt = _tokens_filtered(stmt, h, request)
        _add_tokens(conn, groups, stmt.group_by(*by), width=len(by))
    u = t.token_usage.c
    for lo, hi in hours.edges:
        sums_of = (sa.func.sum(u.prompt_tokens), sa.func.sum(u.completion_tokens))
        label: str | None = None
        edge: AnySelect
        width = 0
        if group_by is ReportGroup.day:
            # An edge lies inside one hour, and so inside one day.
            edge = sa.select(*sums_of)
            label = day_of(lo).isoformat()
        else:
            by = _token_group(u, group_by)
            edge = sa.select(*by, *sums_of).group_by(*by)
            width = len(by)
        edge = edge.where(u.at >= lo, u.at < hi)
        edge = _tokens_filtered(edge, u, request)
        _add_tokens(conn, groups, edge, label=label, width=width)


def _token_group(columns: Any, group_by: ReportGroup) -> list[ColumnElement[Any]]:
    """The columns a token report groups by: two for `key_source`, one otherwise."""
    if group_by is ReportGroup.key_source:
        return [columns.key_id, columns.source]
    return [_group_column(columns, group_by)]


def _tokens_filtered(stmt: AnySelect, columns: Any, request: UsageReportRequest) -> AnySelect:
    stmt = _filtered(stmt, columns.tenant_id, request.tenant_ids)
    stmt = _filtered(stmt, columns.key_id, request.key_ids)
    return _filtered(stmt, columns.endpoint, request.endpoint_ids)


def _add_tokens(
    conn: sa.Connection,
    groups: Groups,
    stmt: AnySelect,
    *,
    label: str | None = None,
    width: int = 1,
) -> None:
    """Add (group columns…, prompt, completion) rows, `width` group columns each (two, key
    and source, are labelled `<key>/<source>`), or (prompt, completion) rows under `label`."""
    for row in conn.execute(stmt):
        *by, prompt, completion = row
        if prompt is None and completion is None:
            continue
        if label is not None:
            group = label
        elif width == 2:
            group = key_source_group(*by)
        else:
            group = _label(by[0])
        sums = groups[group]
        sums.prompt += int(prompt or 0)
        sums.completion += int(completion or 0)
