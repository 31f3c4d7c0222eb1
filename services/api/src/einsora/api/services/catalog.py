"""Classes, regions and machines, as offered now.

A class is offered to a caller in a region when a machine there that the caller may use offers
it, by the catalog's one match (`Catalog.devices_by_class`, the scheduler's), narrowed to what its
owner lends: so what is listed here can be launched by whoever reads it. Every configured class
is listed (with no region where none is offered); a derived one (automatic, MIG) only where it
is offered. Lists are small and held in memory, so they page over a sorted list by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

import sqlalchemy as sa

from einsora.api import models as m
from einsora.api.auth import Principal
from einsora.api.pagination import cursor_str, encode_cursor
from einsora.api.schemas.catalog import (
    ClassOut,
    ClassPage,
    MachinePage,
    RegionOut,
    RegionPage,
    SchedulerOut,
)
from einsora.api.schemas.common import PageQuery
from einsora.api.services.machine_visibility import machine_out
from einsora.api.store import Store
from einsora.api.views.machines import MachineRecord
from einsora.common.catalog import Accelerator, Catalog
from einsora.common.schemas import Lend, RegionStatus, WorkloadState, utcnow
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


HOLDING = tuple(
    s.value
    for s in (
        WorkloadState.scheduled,
        WorkloadState.starting,
        WorkloadState.running,
        WorkloadState.parking,
        WorkloadState.removing,
    )
)
"""The states whose placement holds its machine's devices, cores and memory."""


async def booked(store: Store, machine_ids: Sequence[str]) -> dict[str, list[tuple[str, int]]]:
    """What is placed on these machines now, every tenant's: machine -> [(class, count)]."""
    if not machine_ids:
        return {}
    w = m.workloads.c
    stmt = (
        sa.select(w.placed_machine, w.placed_class, sa.func.sum(w.count))
        .where(w.placed_machine.in_(list(machine_ids)), w.state.in_(HOLDING))
        .group_by(w.placed_machine, w.placed_class)
    )
    found: dict[str, list[tuple[str, int]]] = {}
    async with store.read() as conn:
        for machine, class_name, count in (await conn.execute(stmt)).all():
            found.setdefault(machine, []).append((class_name or "", int(count or 0)))
    return found


def free_by_class(
    catalog: Catalog,
    machines: Sequence[MachineRecord],
    placed: Mapping[str, list[tuple[str, int]]],
) -> dict[str, int]:
    """How many workloads of each class (count 1) the machines could take now: what their
    owners lend of their inventory, less what is placed there. An estimate for people choosing
    a class; the scheduler alone books devices (a GPU workload is taken to hold one device of
    every class its machine serves)."""
    free: dict[str, int] = {}
    for record in machines:
        inventory = record.inventory
        if inventory is None or record.region is None or record.enrolment is None:
            continue
        usable = (record.enrolment.lend or Lend()).usable(inventory)
        gpus_used = cpus_used = 0.0
        memory_used = 0
        for class_name, count in placed.get(record.machine_id, []):
            c = catalog.get(class_name)
            if c is None:
                continue
            if c.accelerator is Accelerator.cpu:
                cpus_used += c.cpus * count
                memory_used += c.memory_mib * count
            else:
                gpus_used += count
        devices = catalog.devices_by_class(inventory)
        lent = set(usable.gpus)
        for c in catalog.offered_by(inventory):
            if c.accelerator is Accelerator.cpu:
                room = [(usable.memory_mib - memory_used) // max(c.memory_mib, 1)]
                if c.cpus > 0:
                    room.append(math.floor((usable.cpus - cpus_used) / c.cpus))
                n = int(min(room))
            else:
                n = sum(1 for uuid in devices.get(c.name, []) if uuid in lent) - int(gpus_used)
            free[c.name] = free.get(c.name, 0) + max(n, 0)
    return free


def lent_classes(catalog: Catalog, record: MachineRecord) -> set[str]:
    """The classes a machine offers within what its owner lends: a GPU class where a lent,
    healthy device serves it, a CPU class where the lent cores and memory hold it."""
    inventory = record.inventory
    if inventory is None or record.enrolment is None:
        return set()
    usable = (record.enrolment.lend or Lend()).usable(inventory)
    lent = set(usable.gpus)
    names = {
        name
        for name, uuids in catalog.devices_by_class(inventory).items()
        if any(uuid in lent for uuid in uuids)
    }
    for c in catalog:
        cpu = c.accelerator is Accelerator.cpu
        if cpu and usable.cpus >= c.cpus and usable.memory_mib >= c.memory_mib:
            names.add(c.name)
    return names


def list_classes(
    catalog: Catalog,
    machines: list[MachineRecord],
    query: PageQuery,
    free: Mapping[str, int] | None = None,
) -> ClassPage:
    """`machines`: those the caller may use (`machine_visibility.visible`), for where classes are
    offered to them; `free`: what those could take now (`free_by_class`), None when not
    counted."""
    offered: dict[str, set[str]] = {}
    for record in machines:
        if record.region is not None:
            for name in lent_classes(catalog, record):
                offered.setdefault(name, set()).add(record.region)
    classes = sorted(
        (c for c in catalog if not c.automatic or c.name in offered), key=lambda c: c.name
    )
    page, cursor = _page(classes, lambda c: c.name, query)
    items = [
        ClassOut(
            name=c.name,
            accelerator=c.accelerator,
            description=c.description,
            model=c.model,
            memory_gib=c.memory_gib,
            cpus=c.cpus,
            mig_profile=c.mig_profile,
            automatic=c.automatic,
            regions=sorted(offered.get(c.name, ())),
            free=None if free is None else free.get(c.name, 0),
        )
        for c in page
    ]
    return ClassPage(items=items, next_cursor=cursor)


def list_regions(
    default_region: str,
    machines: list[MachineRecord],
    query: PageQuery,
    schedulers: Mapping[str, RegionStatus] | None = None,
    now: datetime | None = None,
) -> RegionPage:
    """Every region (this api's own, each machine's, each whose scheduler reported), with its
    scheduler's liveness and what it has free (ADR-0022)."""
    schedulers = schedulers or {}
    counts: dict[str, int] = {default_region: 0, **dict.fromkeys(schedulers, 0)}
    for record in machines:
        if record.region is not None:
            counts[record.region] = counts.get(record.region, 0) + 1
    now = now or utcnow()
    regions = [_region(n, c, schedulers.get(n), now) for n, c in sorted(counts.items())]
    page, cursor = _page(regions, lambda r: r.name, query)
    return RegionPage(items=page, next_cursor=cursor)


def _region(name: str, machines: int, status: RegionStatus | None, now: datetime) -> RegionOut:
    if status is None:
        scheduler = SchedulerOut(
            state="unknown",
            last_seen=None,
            reason=f"no scheduler of region {name} has reported since this api started",
        )
        return RegionOut(name=name, machines=machines, scheduler=scheduler)
    why = status.why_down(now)
    scheduler = SchedulerOut(state="down" if why else "up", last_seen=status.at, reason=why)
    return RegionOut(
        name=name,
        machines=machines,
        scheduler=scheduler,
        available_machines=0 if why else status.machines,
        free={} if why else dict(status.free),
        queued=status.queued,
    )


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
    """`machines`: those the viewer may see (`machine_visibility.visible`); `owner_names`: their
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
