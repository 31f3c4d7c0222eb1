"""`/v1/workloads`: launch, list, show, park, resume, remove, and the timeline."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from starlette.responses import Response

from einsora.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    PARAM_ERRORS,
    Call,
    JsonBody,
    Launch,
    Me,
    Traceparent,
    errors,
    operation_id,
    reply,
    traceparent_of,
)
from einsora.api.projections.model_fallbacks import model_fallback
from einsora.api.routers import events
from einsora.api.routers.events import LastEventId, stream_responses
from einsora.api.schemas.common import PageQuery
from einsora.api.schemas.workloads import (
    TimelinePage,
    WorkloadCreate,
    WorkloadListQuery,
    WorkloadOut,
    WorkloadPage,
)
from einsora.api.services import machine_visibility, timeline, workloads
from einsora.api.services.fallback import has_steps
from einsora.common.schemas import IntentAction, StepKind

router = APIRouter(tags=["workloads"], generate_unique_id_function=operation_id)

IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retrying a POST with the same key (in the same tenant) returns the first "
        "result",
        pattern=IDEMPOTENCY_KEY_PATTERN,
    ),
]
WorkloadId = Annotated[str, Path(alias="id")]


@router.post(
    "/v1/workloads",
    summary="Launch a workload (answers at once with state `pending`)",
    response_model=WorkloadOut,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS, 409),
)
async def create_workload(
    call: Launch,
    body: Annotated[WorkloadCreate, Depends(JsonBody(WorkloadCreate))],
    idempotency_key: IdempotencyKey = None,
    traceparent: Traceparent = None,
) -> Response:
    ctx = call.ctx
    settings = ctx.settings
    # The api's own region needs no look at every machine (a launch's hot path), unless its
    # fallback chain names regions or machines (ADR-0022).
    places = has_steps(body, StepKind.region, StepKind.machine)
    wide = places or body.region not in (None, settings.region)
    snapshot = ctx.machines.snapshot() if wide else []
    out, replayed = await workloads.create(
        ctx.store,
        ctx.catalog,
        call.me,
        body,
        default_region=settings.region,
        regions=workloads.known_regions(settings.region, snapshot, ctx.regions.snapshot())
        if wide
        else {settings.region},
        default_cap=settings.tenant_max_workloads,
        request_id=call.request_id,
        traceparent=traceparent_of(traceparent),
        idempotency_key=idempotency_key,
        machines={
            r.machine_id: r
            for r in machine_visibility.visible(
                snapshot, call.me, community_pool=settings.community_pool
            )
        }
        if places
        else None,
        waits_because=ctx.regions.why_down(body.region or settings.region, ctx.clock()),
        model_dirs=settings.model_dir_paths,
    )
    if not replayed and ctx.model_fallbacks is not None:
        record = model_fallback(out.id, out.tenant_id, out.name, list(out.fallback))
        if record is not None:  # before the 201: the gateway can fall back at once
            await ctx.model_fallbacks.put(record)
    return reply(out, 201, {"Idempotent-Replayed": "true"} if replayed else None)


@router.get(
    "/v1/workloads",
    summary="List the tenant's workloads, newest first",
    response_model=WorkloadPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS),
)
async def list_workloads(call: Me, query: Annotated[WorkloadListQuery, Query()]) -> Response:
    return reply(await workloads.list_workloads(call.ctx.store, call.me, query))


@router.get(
    "/v1/workloads/{id}",
    summary="Show a workload, with its placement once placed",
    response_model=WorkloadOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def get_workload(call: Me, workload_id: WorkloadId) -> Response:
    return reply(await workloads.get(call.ctx.store, call.me, workload_id))


async def _act(
    call: Call, workload_id: str, action: IntentAction, traceparent: str | None
) -> Response:
    out = await workloads.act(
        call.ctx.store,
        call.me,
        workload_id,
        action,
        request_id=call.request_id,
        traceparent=traceparent_of(traceparent),
    )
    return reply(out, 202)


@router.post(
    "/v1/workloads/{id}/park",
    summary="Park a workload: release its GPUs, keep its disks",
    response_model=WorkloadOut,
    status_code=202,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404, 409),
)
async def park_workload(
    call: Me, workload_id: WorkloadId, traceparent: Traceparent = None
) -> Response:
    return await _act(call, workload_id, IntentAction.park, traceparent)


@router.post(
    "/v1/workloads/{id}/resume",
    summary="Resume a parked, failed or preempted workload",
    response_model=WorkloadOut,
    status_code=202,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404, 409),
)
async def resume_workload(
    call: Me, workload_id: WorkloadId, traceparent: Traceparent = None
) -> Response:
    return await _act(call, workload_id, IntentAction.resume, traceparent)


@router.delete(
    "/v1/workloads/{id}",
    summary="Remove a workload",
    response_model=WorkloadOut,
    status_code=202,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404, 409),
)
async def remove_workload(
    call: Me, workload_id: WorkloadId, traceparent: Traceparent = None
) -> Response:
    return await _act(call, workload_id, IntentAction.remove, traceparent)


@router.get(
    "/v1/workloads/{id}/events",
    summary="A workload's timeline, oldest first; with `follow=true`, its changes as "
    "server-sent events (a `snapshot`, then each `workload` change; resume with Last-Event-ID)",
    response_model=TimelinePage,
    responses=stream_responses(404, page=True),
)
async def list_events(
    request: Request,
    call: Me,
    workload_id: WorkloadId,
    query: Annotated[PageQuery, Query()],
    follow: Annotated[
        bool,
        Query(
            description="Answer with the workload's event stream (`text/event-stream`) instead "
            "of a page of its timeline"
        ),
    ] = False,
    last_event_id: LastEventId = None,
) -> Response:
    if follow:
        return await events.follow(request, call, workload_id, last_event_id)
    return reply(await timeline.list_entries(call.ctx.store, call.me, workload_id, query))
