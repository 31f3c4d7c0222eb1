"""Each tenant's recent use, as the scheduler reads it from KV `usage/tenant.<id>`.

- `gpu_hours_7d`: GPU-hours of the last 7 days, open allocations up to now (the report's sums);
- `decayed_gpu_hours`: fair share's U, every GPU-hour weighted 2^(-age / half-life): the
  closed allocations' figure kept per tenant (decayed on to now) plus each open allocation's
  exact integral up to now (decay.py);
- `open_gpus`: GPUs held now, by placed class.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.decay import decay, decayed_gpu_hours
from einsora.accounting.reports import Groups, Sums, allocation_sums
from einsora.accounting.rows import allocation_of
from einsora.common.schemas import ReportGroup, TenantUsage

WEEK = timedelta(days=7)
FORGOTTEN_AFTER_HALF_LIVES = 30
"""A tenant idle this many half-lives (its usage weighs under 1e-9 of what it was) and longer
than a week is no longer republished; its last value, and `at`, stay in KV."""


def recent_window(half_life_h: float) -> timedelta:
    """How long after its last use a tenant's usage is still republished."""
    return max(WEEK, timedelta(hours=half_life_h * FORGOTTEN_AFTER_HALF_LIVES))


def recent_tenants(conn: sa.Connection, now: datetime, half_life_h: float) -> list[str]:
    """Tenants active within the window, or holding an allocation now."""
    since = now - recent_window(half_life_h)
    active = conn.execute(
        sa.select(t.tenants.c.tenant_id).where(t.tenants.c.last_active_at >= since)
    ).scalars()
    holding = conn.execute(
        sa.select(t.allocations.c.tenant_id).where(t.allocations.c.ended_at.is_(None)).distinct()
    ).scalars()
    return sorted(set(active) | set(holding))


def tenant_usage(
    conn: sa.Connection, tenant_ids: Sequence[str], now: datetime, half_life_h: float
) -> list[TenantUsage]:
    """These tenants' usage as of `now` (a read unit)."""
    ids = sorted(set(tenant_ids))
    if not ids:
        return []
    week: Groups = defaultdict(Sums)
    allocation_sums(conn, week, ReportGroup.tenant, now - WEEK, now, now, tenant_ids=ids)
    decayed: dict[str, float] = defaultdict(float)
    for r in conn.execute(sa.select(t.tenants).where(t.tenants.c.tenant_id.in_(ids))):
        decayed[r.tenant_id] = decay(r.decayed_gpu_hours, r.decayed_at, now, half_life_h)
    open_gpus: dict[str, dict[str, int]] = defaultdict(dict)
    rows = conn.execute(
        sa.select(t.allocations).where(
            t.allocations.c.ended_at.is_(None), t.allocations.c.tenant_id.in_(ids)
        )
    )
    for a in map(allocation_of, rows):
        held = open_gpus[a.tenant_id]
        held[a.placed_class] = held.get(a.placed_class, 0) + a.gpu_count
        decayed[a.tenant_id] += decayed_gpu_hours(
            a.gpu_count, a.started_at, max(now, a.started_at), now, half_life_h
        )
    return [
        TenantUsage(
            tenant_id=tenant,
            gpu_hours_7d=week[tenant].gpu_s / 3600.0 if tenant in week else 0.0,
            decayed_gpu_hours=decayed.get(tenant, 0.0),
            half_life_h=half_life_h,
            open_gpus=open_gpus.get(tenant, {}),
            at=now,
        )
        for tenant in ids
    ]


def rebuild_decay(conn: sa.Connection, half_life_h: float, now: datetime) -> int:
    """Work each tenant's decayed figure out again from its closed allocations where it was
    kept with another half-life (the operator changed it); how many tenants (a unit)."""
    stale = list(
        conn.execute(
            sa.select(t.tenants.c.tenant_id).where(t.tenants.c.half_life_h != half_life_h)
        ).scalars()
    )
    if not stale:
        return 0
    a = t.allocations.c
    rows = conn.execute(
        sa.select(a.tenant_id, a.gpu_count, a.started_at, a.ended_at).where(
            a.ended_at.is_not(None), a.tenant_id.in_(stale)
        )
    ).all()
    at = max([now, *(r.ended_at for r in rows)])
    values: dict[str, float] = defaultdict(float)
    for r in rows:
        values[r.tenant_id] += decayed_gpu_hours(
            r.gpu_count, r.started_at, r.ended_at, at, half_life_h
        )
    conn.execute(
        t.tenants.update()
        .where(t.tenants.c.tenant_id == sa.bindparam("b_tenant_id"))
        .values(
            decayed_gpu_hours=sa.bindparam("b_value"),
            decayed_at=sa.bindparam("b_at"),
            half_life_h=sa.bindparam("b_half_life"),
        ),
        [
            {"b_tenant_id": k, "b_value": values[k], "b_at": at, "b_half_life": half_life_h}
            for k in stale
        ],
    )
    return len(stale)
