"""`/v1/classes`, `/v1/regions`, `/v1/machines`: what can be launched, and where."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.responses import Response

from einsora.api.deps import AUTH_ERRORS, PARAM_ERRORS, Me, errors, operation_id, reply
from einsora.api.schemas.catalog import ClassPage, MachinePage, RegionPage
from einsora.api.schemas.common import PageQuery
from einsora.api.services import catalog, machine_visibility

router = APIRouter(tags=["catalog"], generate_unique_id_function=operation_id)
Page = Annotated[PageQuery, Query()]


@router.get(
    "/v1/classes",
    summary="The GPU and CPU classes, with the regions where machines you may use offer each "
    "now (within what their owners lend) and how many more they could take",
    response_model=ClassPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_classes(call: Me, query: Page) -> Response:
    ctx = call.ctx
    machines = ctx.machines.snapshot()
    # Only what the caller may use, within its owners' lends: what they could launch.
    mine = machine_visibility.visible(machines, call.me, community_pool=ctx.settings.community_pool)
    placed = await catalog.booked(ctx.store, [r.machine_id for r in mine])
    free = catalog.free_by_class(ctx.catalog, mine, placed)
    return reply(catalog.list_classes(ctx.catalog, mine, query, free))


@router.get(
    "/v1/regions",
    summary="The regions (this api's own, every machine's, every scheduler's), each with its "
    "scheduler's liveness and free capacity per class",
    response_model=RegionPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_regions(call: Me, query: Page) -> Response:
    ctx = call.ctx
    return reply(
        catalog.list_regions(
            ctx.settings.region,
            ctx.machines.snapshot(),
            query,
            ctx.regions.snapshot(),
            ctx.clock(),
        )
    )


@router.get(
    "/v1/machines",
    summary="The machines you may use: your tenant's, those it is a guest of, and the community "
    "pool's where this instance runs one (the operator: all), with their inventory, last "
    "heartbeat and how many workloads they run (yours; the operator's count is every tenant's)",
    response_model=MachinePage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_machines(call: Me, query: Page) -> Response:
    # Another tenant's workloads are not told, not even as a count: the operator sees every
    # workload a machine runs, anyone else their own tenant's.
    me = call.me
    store = call.ctx.store
    own = None if me.is_operator else await catalog.tenant_counts(store, me)
    pool = call.ctx.settings.community_pool
    seen = machine_visibility.visible(call.ctx.machines.snapshot(), me, community_pool=pool)
    names = await machine_visibility.owner_names(store, seen)
    return reply(catalog.list_machines(seen, query, me, names, own))
