"""`/v1/workloads`: launch, list, show, park, resume, remove, and the timeline."""

from __future__ import annotations

import re

from starlette.responses import Response

from einsora.api.errors import field_error
from einsora.api.operation import Call, HeaderParam, Operation
from einsora.api.schemas.common import NoBody, NoQuery, PageQuery
from einsora.api.schemas.workloads import (
    TimelinePage,
    WorkloadCreate,
    WorkloadListQuery,
    WorkloadOut,
    WorkloadPage,
)
from einsora.api.services import timeline, workloads
from einsora.common.schemas import IntentAction

IDEMPOTENCY_KEY = HeaderParam(
    "Idempotency-Key",
    "Retrying a POST with the same key (in the same tenant) returns the first result",
    r"^[A-Za-z0-9._:-]{1,128}$",
)
_KEY_RE = re.compile(IDEMPOTENCY_KEY.pattern)


async def create_workload(call: Call[WorkloadCreate, NoQuery]) -> Response:
    key = call.header(IDEMPOTENCY_KEY.name)
    if key is not None and not _KEY_RE.match(key):
        raise field_error(IDEMPOTENCY_KEY.name, "1 to 128 letters, digits, '.', '_', ':' or '-'")
    settings = call.ctx.settings
    out, replayed = await workloads.create(
        call.ctx.store,
        call.ctx.catalog,
        call.me,
        call.body,
        default_region=settings.region,
        # The api's own region needs no look at every machine (a launch's hot path).
        regions={settings.region}
        if call.body.region in (None, settings.region)
        else workloads.known_regions(settings.region, call.ctx.machines.snapshot()),
        default_cap=settings.tenant_max_workloads,
        request_id=call.request_id,
        traceparent=call.traceparent,
        idempotency_key=key,
    )
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return Response(
        out.model_dump_json(), status_code=201, headers=headers, media_type="application/json"
    )


async def list_workloads(call: Call[NoBody, WorkloadListQuery]) -> WorkloadPage:
    return await workloads.list_workloads(call.ctx.store, call.me, call.query)


async def get_workload(call: Call[NoBody, NoQuery]) -> WorkloadOut:
    return await workloads.get(call.ctx.store, call.me, call.path("id"))


async def _act(call: Call[NoBody, NoQuery], action: IntentAction) -> WorkloadOut:
    return await workloads.act(
        call.ctx.store,
        call.me,
        call.path("id"),
        action,
        request_id=call.request_id,
        traceparent=call.traceparent,
    )


async def park_workload(call: Call[NoBody, NoQuery]) -> WorkloadOut:
    return await _act(call, IntentAction.park)


async def resume_workload(call: Call[NoBody, NoQuery]) -> WorkloadOut:
    return await _act(call, IntentAction.resume)


async def remove_workload(call: Call[NoBody, NoQuery]) -> WorkloadOut:
    return await _act(call, IntentAction.remove)


async def list_events(call: Call[NoBody, PageQuery]) -> TimelinePage:
    return await timeline.list_entries(call.ctx.store, call.me, call.path("id"), call.query)


OPERATIONS = [
    Operation(
        "POST",
        "/v1/workloads",
        create_workload,
        "Launch a workload (answers at once with state `pending`)",
        "workloads",
        WorkloadOut,
        status=201,
        body=WorkloadCreate,
        headers=(IDEMPOTENCY_KEY,),
        errors=(409,),
        launch=True,
    ),
    Operation(
        "GET",
        "/v1/workloads",
        list_workloads,
        "List the tenant's workloads, newest first",
        "workloads",
        WorkloadPage,
        query=WorkloadListQuery,
    ),
    Operation(
        "GET",
        "/v1/workloads/{id}",
        get_workload,
        "Show a workload, with its placement once placed",
        "workloads",
        WorkloadOut,
        errors=(404,),
    ),
    Operation(
        "POST",
        "/v1/workloads/{id}/park",
        park_workload,
        "Park a workload: release its GPUs, keep its disks",
        "workloads",
        WorkloadOut,
        status=202,
        errors=(404, 409),
    ),
    Operation(
        "POST",
        "/v1/workloads/{id}/resume",
        resume_workload,
        "Resume a parked or failed workload",
        "workloads",
        WorkloadOut,
        status=202,
        errors=(404, 409),
    ),
    Operation(
        "DELETE",
        "/v1/workloads/{id}",
        remove_workload,
        "Remove a workload",
        "workloads",
        WorkloadOut,
        status=202,
        errors=(404, 409),
    ),
    Operation(
        "GET",
        "/v1/workloads/{id}/events",
        list_events,
        "A workload's timeline, oldest first",
        "workloads",
        TimelinePage,
        query=PageQuery,
        errors=(404,),
    ),
]
