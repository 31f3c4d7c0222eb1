"""Classes, regions and machines, as offered now.

A class is offered in a region when a machine there offers it, by `Catalog.offered_by`: the match
the scheduler places by, so what is listed here can be launched. Lists are small and held in
memory, so they page over a sorted list by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.machines import MachineRecord
from einsora.api.pagination import cursor_str, encode_cursor
from einsora.api.schemas.catalog import (
    ClassOut,
    ClassPage,
    MachinePage,
    RegionOut,
    RegionPage,
)
from einsora.api.schemas.common import PageQuery
from einsora.api.services.machine_sharing import machine_out
from einsora.api.store import Store
from einsora.common.catalog import Catalog
from einsora.common.schemas.workload import TERMINAL_STATES

T = TypeVar("T")


def _page(
    items: Sequence[T], key: Callable[[T], str], query: PageQuery
) -> tuple[list[T], str | None]:
    after = cursor_str(query.cursor)
    rest = [i for i in items if after is None or key(i) > after]
    page = rest[: query.limit]
    more = len(rest) > query.limit
    return page, encode_cursor(key(page[-1])) if more else None


def list_classes(catalog: Catalog, machines: list[MachineRecord], query: PageQuery) -> ClassPage:
    offered: dict[str, set[str]] = {}
    for record in machines:
        if record.inventory is not None and record.region is not None:
            for c in catalog.offered_by(record.inventory):
                offered.setdefault(c.name, set()).add(record.region)
    classes = sorted(catalog, key=lambda c: c.name)
    page, cursor = _page(classes, lambda c: c.name, query)
    items = [
        ClassOut(
            name=c.name,
            accelerator=c.accelerator,
            description=c.description,
            model=c.model,
            memory_gib=c.memory_gib,
            cpus=c.cpus,
            regions=sorted(offered.get(c.name, ())),
        )
        for c in page
    ]
    return ClassPage(items=items, next_cursor=cursor)


def list_regions(
    default_region: str, machines: list[MachineRecord], query: PageQuery
) -> RegionPage:
    counts: dict[str, int] = {default_region: 0}
    for record in machines:
        if record.region is not None:
            counts[record.region] = counts.get(record.region, 0) + 1
    regions = [RegionOut(name=n, machines=c) for n, c in sorted(counts.items())]
    page, cursor = _page(regions, lambda r: r.name, query)
    return RegionPage(items=page, next_cursor=cursor)


async def tenant_counts(store: Store, principal: Principal) -> dict[str, int]:
    """How many of the caller's tenant's workloads are placed on each machine, not yet removed."""
    stmt = (
        sa.select(m.workloads.c.placed_machine, sa.func.count())
        .where(
            m.workloads.c.tenant_id == principal.tenant_id,
            m.workloads.c.placed_machine.is_not(None),
            m.workloads.c.state.not_in([s.value for s in TERMINAL_STATES]),
        )
        .group_by(m.workloads.c.placed_machine)
    )
    async with store.read() as conn:
        return {machine: int(n) for machine, n in (await conn.execute(stmt)).all()}


def list_machines(
    machines: list[MachineRecord],
    query: PageQuery,
    viewer: Principal,
    owner_names: Mapping[str, str],
    own: dict[str, int] | None = None,
) -> MachinePage:
    """`machines`: those the viewer may see (`machine_sharing.visible`); `owner_names`: their
    owner tenants' names by id; `own`: the caller's tenant's counts per machine; None (the
    operator) counts them all."""
    page, cursor = _page(machines, lambda r: r.machine_id, query)
    items = [
        machine_out(
            r,
            viewer,
            None if r.enrolment is None else owner_names.get(r.enrolment.owner_tenant_id),
            r.workload_count if own is None else own.get(r.machine_id, 0),
        )
        for r in page
    ]
    return MachinePage(items=items, next_cursor=cursor)
