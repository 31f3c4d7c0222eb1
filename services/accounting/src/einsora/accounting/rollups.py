"""What a closed allocation adds beyond its own row: its day pieces, the day sums, and its
tenant's decayed usage, all in the transaction that closes it.

These are derived figures (a report or the usage KV reads them; nothing else writes them), so
they change exactly when an allocation closes, and so exactly once; when a late event moves a
close (late.py), what the old end added is taken back in the transaction that records the new.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from einsora.accounting import tables as t
from einsora.accounting.decay import decay, decayed_gpu_hours
from einsora.accounting.model import Allocation
from einsora.accounting.periods import day_pieces


def ensure_locked(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], touch: str
) -> list[Any]:
    """Insert the rows that are missing, lock every one of them until the transaction ends,
    and return them as stored, in one statement (`INSERT … ON CONFLICT DO UPDATE` setting
    `touch` to itself, `RETURNING *`). Give the rows in key order, with distinct keys: two
    transactions locking the same rows then wait for each other rather than deadlock."""
    if not rows:
        return []
    return list(conn.execute(_ensure_locked(conn.dialect.name, table, touch), list(rows)))


@functools.cache
def _ensure_locked(dialect: str, table: sa.Table, touch: str) -> Any:
    insert = sqlite.insert if dialect == "sqlite" else postgresql.insert
    return (
        insert(table)
        .on_conflict_do_update(
            index_elements=list(table.primary_key.columns), set_={touch: table.c[touch]}
        )
        .returning(*table.c)
    )


def upsert_adding(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], adds: tuple[str, ...]
) -> None:
    """Insert rows, or add their `adds` columns to the row with the same primary key. The rows
    must have distinct keys (Postgres refuses one statement touching a row twice)."""
    if rows:
        conn.execute(_upsert_adding(conn.dialect.name, table, adds), list(rows))


@functools.cache
def _upsert_adding(dialect: str, table: sa.Table, adds: tuple[str, ...]) -> Any:
    insert = sqlite.insert if dialect == "sqlite" else postgresql.insert
    stmt = insert(table)
    return stmt.on_conflict_do_update(
        index_elements=list(table.primary_key.columns),
        set_={c: table.c[c] + stmt.excluded[c] for c in adds},
    )


def record_closed(
    conn: sa.Connection,
    closed: Sequence[Allocation],
    half_life_h: float,
    *,
    active: Mapping[str, datetime] | None = None,
) -> None:
    """The day pieces and sums of allocations just closed (stored, with their ids), and their
    tenants' decayed usage; `active`: tenants that opened an allocation then, too."""
    pieces, sums = _pieces_and_sums(closed)
    if pieces:
        conn.execute(t.allocation_days.insert(), pieces)
    _add_to_days(conn, sums, 1.0)
    update_tenants(conn, _held_by(closed, 1), active or {}, half_life_h)


def retract_closed(conn: sa.Connection, closed: Sequence[Allocation], half_life_h: float) -> None:
    """Take back what `record_closed` added for these allocations, as they were closed then (a
    late event moves a close: it is retracted, then recorded again with its new end)."""
    if not closed:
        return
    ids = [a.id for a in closed]
    conn.execute(t.allocation_days.delete().where(t.allocation_days.c.allocation_id.in_(ids)))
    _add_to_days(conn, _pieces_and_sums(closed)[1], -1.0)
    update_tenants(conn, _held_by(closed, -1), {}, half_life_h)


def _pieces_and_sums(
    closed: Sequence[Allocation],
) -> tuple[list[dict[str, Any]], dict[tuple[Any, ...], list[float]]]:
    pieces: list[dict[str, Any]] = []
    sums: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for a in closed:
        assert a.id is not None
        assert a.ended_at is not None
        for day, start, end in day_pieces(a.started_at, a.ended_at):
            start_s, end_s = start.timestamp(), end.timestamp()
            pieces.append(
                {
                    "allocation_id": a.id,
                    "day": day,
                    "tenant_id": a.tenant_id,
                    "workload_id": a.workload_id,
                    "placed_class": a.placed_class,
                    "region": a.region,
                    "gpu_count": a.gpu_count,
                    "cpus": a.cpus,
                    "start_s": start_s,
                    "end_s": end_s,
                }
            )
            held = end_s - start_s
            key = (day, a.tenant_id, a.placed_class, a.region)
            sums[key][0] += a.gpu_count * held
            sums[key][1] += a.cpus * held
    return pieces, sums


def _add_to_days(
    conn: sa.Connection, sums: Mapping[tuple[Any, ...], list[float]], sign: float
) -> None:
    upsert_adding(
        conn,
        t.usage_days,
        [
            {
                "day": day,
                "tenant_id": tenant,
                "placed_class": klass,
                "region": region,
                "gpu_seconds": sign * gpu_s,
                "cpu_core_seconds": sign * cpu_s,
            }
            for (day, tenant, klass, region), (gpu_s, cpu_s) in sums.items()
        ],
        ("gpu_seconds", "cpu_core_seconds"),
    )


def _held_by(
    closed: Sequence[Allocation], sign: int
) -> dict[str, list[tuple[int, datetime, datetime]]]:
    """Each tenant's closed intervals as (GPUs, start, end); `sign` -1 takes them back."""
    held_by: dict[str, list[tuple[int, datetime, datetime]]] = defaultdict(list)
    for a in closed:
        assert a.ended_at is not None
        held_by[a.tenant_id].append((sign * a.gpu_count, a.started_at, a.ended_at))
    return held_by


def update_tenants(
    conn: sa.Connection,
    held: Mapping[str, Iterable[tuple[int, datetime, datetime]]],
    active: Mapping[str, datetime],
    half_life_h: float,
) -> None:
    """Add closed intervals (GPUs, start, end) to each tenant's decayed usage, and note when
    each tenant was last active (`active`: an allocation opened then). Negative GPUs take an
    interval back (a close moved by a late event); the figure never goes below zero."""
    held = {k: list(v) for k, v in held.items()}
    tenant_ids = sorted(set(held) | set(active))
    if not tenant_ids:
        return
    latest: dict[str, datetime] = {}
    for tenant in tenant_ids:
        moments = [end for _, _, end in held.get(tenant, [])]
        if tenant in active:
            moments.append(active[tenant])
        latest[tenant] = max(moments)
    rows = ensure_locked(
        conn,
        t.tenants,
        [
            {
                "tenant_id": tenant,
                "decayed_gpu_hours": 0.0,
                "decayed_at": latest[tenant],
                "half_life_h": half_life_h,
                "last_active_at": latest[tenant],
            }
            for tenant in tenant_ids
        ],
        touch="tenant_id",
    )
    updates = []
    for r in rows:
        intervals = held.get(r.tenant_id, [])
        at = max([r.decayed_at, *(end for _, _, end in intervals)])
        value = decay(r.decayed_gpu_hours, r.decayed_at, at, half_life_h)
        value += sum(decayed_gpu_hours(g, s, e, at, half_life_h) for g, s, e in intervals)
        value = max(value, 0.0)  # what is taken back was added before, up to rounding
        updates.append(
            {
                "b_tenant_id": r.tenant_id,
                "b_value": value,
                "b_at": at,
                "b_active": max(r.last_active_at, latest[r.tenant_id]),
            }
        )
    conn.execute(_UPDATE_TENANT, updates)


_UPDATE_TENANT = (
    t.tenants.update()
    .where(t.tenants.c.tenant_id == sa.bindparam("b_tenant_id"))
    .values(
        decayed_gpu_hours=sa.bindparam("b_value"),
        decayed_at=sa.bindparam("b_at"),
        last_active_at=sa.bindparam("b_active"),
    )
)
