"""Quotas: the operator's limits on a tenant's GPUs (per class and in all) and GPU-hours per 7 days.

The operator sets them (`tenant_quotas`); the scheduler enforces them, reading each tenant's
quota from KV `usage/quota.<tenant>` (`TenantQuota`), which the route puts before it answers
and `projections/quotas.py` keeps equal to the store. A tenant's own members may read its
quota, with the use accounting last published (`usage/tenant.<tenant>`); any other tenant
answers 404.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.errors import Forbidden, Unprocessable
from einsora.api.schemas.quotas import QuotaOut, QuotaUpdate, QuotaUse
from einsora.api.services.tenants import visible_tenant
from einsora.api.store import Store
from einsora.common.catalog import Accelerator, Catalog
from einsora.common.schemas import TenantQuota, TenantUsage

_q = m.tenant_quotas.c
_COLUMNS = (_q.tenant_id, _q.max_gpus, _q.max_gpus_total, _q.gpu_hours_per_7d, _q.updated_at)


def check_classes(catalog: Catalog, max_gpus: dict[str, int]) -> None:
    """Refuse (422, naming each) a class that is not a GPU class of the catalog."""
    details = []
    for name in max_gpus:
        known = catalog.get(name)
        if known is None:
            why = "no such class in the catalog (GET /v1/classes lists them)"
        elif known.accelerator is Accelerator.cpu:
            why = "a CPU class has no GPUs to count; name a GPU class"
        else:
            continue
        details.append({"field": f"max_gpus.{name}", "message": why, "type": "unknown_class"})
    if details:
        shown = ", ".join(repr(d["field"].removeprefix("max_gpus.")) for d in details[:3])
        raise Unprocessable(f"max_gpus: not a GPU class of the catalog: {shown}", details=details)


async def get(store: Store, principal: Principal, tenant_id: str) -> tuple[str, QuotaOut]:
    """A tenant's quota, for the operator or its own members (any other tenant: 404)."""
    async with store.read() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        return tenant.id, _out(await _row(conn, tenant.id))


async def put(
    store: Store,
    principal: Principal,
    tenant_id: str,
    body: QuotaUpdate,
    catalog: Catalog,
    now: datetime,
) -> tuple[str, QuotaOut]:
    """Set a tenant's quota (the operator only); members of the tenant get 403, others 404."""
    async with store.write() as conn:
        tenant = await visible_tenant(conn, principal, tenant_id)
        if not principal.is_operator:
            raise Forbidden("only the operator sets a tenant's quota")
        max_gpus = dict(sorted((body.max_gpus or {}).items()))
        check_classes(catalog, max_gpus)
        values: dict[str, Any] = {
            "max_gpus": json.dumps(max_gpus),
            "max_gpus_total": body.max_gpus_total,
            "gpu_hours_per_7d": body.gpu_hours_per_7d,
            "updated_at": now,
        }
        dialect = sqlite if conn.dialect.name == "sqlite" else postgresql
        await conn.execute(
            dialect.insert(m.tenant_quotas)
            .values(tenant_id=tenant.id, **values)
            .on_conflict_do_update(index_elements=["tenant_id"], set_=values)
        )
        return tenant.id, _out(await _row(conn, tenant.id))


async def published(store: Store, tenant_id: str) -> TenantQuota | None:
    """What the scheduler should read of one tenant's quota (None: the operator set none)."""
    async with store.read() as conn:
        row = await _row(conn, tenant_id)
    return None if row is None else _published(row)


async def every_published(store: Store) -> dict[str, TenantQuota]:
    """Every tenant's quota as the scheduler should read it, by tenant id."""
    async with store.read() as conn:
        rows = (await conn.execute(sa.select(*_COLUMNS))).all()
    return {row.tenant_id: _published(row) for row in rows}


def use_of(usage: TenantUsage | None) -> QuotaUse:
    """A tenant's use as accounting published it; zeros when it has not (yet)."""
    if usage is None:
        return QuotaUse(gpus={}, gpus_total=0, gpu_hours_7d=0.0, at=None)
    gpus = {name: n for name, n in sorted(usage.open_gpus.items()) if n}
    return QuotaUse(
        gpus=gpus, gpus_total=sum(gpus.values()), gpu_hours_7d=usage.gpu_hours_7d, at=usage.at
    )


async def _row(conn: AsyncConnection, tenant_id: str) -> Any:
    return (await conn.execute(sa.select(*_COLUMNS).where(_q.tenant_id == tenant_id))).first()


def _max_gpus(stored: str) -> dict[str, int]:
    return {str(name): int(n) for name, n in json.loads(stored).items()}


def _out(row: Any) -> QuotaOut:
    if row is None:
        return QuotaOut(max_gpus={}, max_gpus_total=None, gpu_hours_per_7d=None, updated_at=None)
    return QuotaOut(
        max_gpus=_max_gpus(row.max_gpus),
        max_gpus_total=row.max_gpus_total,
        gpu_hours_per_7d=row.gpu_hours_per_7d,
        updated_at=row.updated_at,
    )


def _published(row: Any) -> TenantQuota:
    return TenantQuota(
        tenant_id=row.tenant_id,
        max_gpus=_max_gpus(row.max_gpus),
        max_gpus_total=row.max_gpus_total,
        gpu_hours_per_7d=row.gpu_hours_per_7d,
    )
