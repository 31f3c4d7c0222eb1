"""`/v1/classes`, `/v1/regions`, `/v1/machines`: what can be launched, and where."""

from __future__ import annotations

from einsora.api.operation import Call, Operation
from einsora.api.schemas.catalog import ClassPage, MachinePage, RegionPage
from einsora.api.schemas.common import NoBody, PageQuery
from einsora.api.services import catalog


async def list_classes(call: Call[NoBody, PageQuery]) -> ClassPage:
    return catalog.list_classes(call.ctx.catalog, call.ctx.machines.snapshot(), call.query)


async def list_regions(call: Call[NoBody, PageQuery]) -> RegionPage:
    machines = call.ctx.machines.snapshot()
    return catalog.list_regions(call.ctx.settings.region, machines, call.query)


async def list_machines(call: Call[NoBody, PageQuery]) -> MachinePage:
    # Another tenant's workloads are not told, not even as a count: the operator sees every
    # workload a machine runs, anyone else their own tenant's.
    own = None if call.me.is_operator else await catalog.tenant_counts(call.ctx.store, call.me)
    return catalog.list_machines(call.ctx.machines.snapshot(), call.query, own)


OPERATIONS = [
    Operation(
        "GET",
        "/v1/classes",
        list_classes,
        "The GPU and CPU classes, with the regions that offer each now",
        "catalog",
        ClassPage,
        query=PageQuery,
    ),
    Operation(
        "GET",
        "/v1/regions",
        list_regions,
        "The regions: this api's own and every region a machine reports",
        "catalog",
        RegionPage,
        query=PageQuery,
    ),
    Operation(
        "GET",
        "/v1/machines",
        list_machines,
        "The machines, with their inventory, last heartbeat and how many workloads they run "
        "(yours; the operator's count is every tenant's)",
        "catalog",
        MachinePage,
        query=PageQuery,
    ),
]
