"""`/v1/events`: every change to the tenant's workloads as server-sent events; and `follow`, the
same for one workload, which `GET /v1/workloads/{id}/events?follow=true` answers with.

The streams themselves are `consumers/streams.py`'s; this is their HTTP face: who calls, which
`Last-Event-ID` they resume after, and the document.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from starlette.responses import Response

from einsora.api.consumers.streams import (
    MEDIA_TYPE,
    EventStreamResponse,
    EventStreams,
    parse_last_event_id,
)
from einsora.api.deps import AUTH_ERRORS, PARAM_ERRORS, Call, Me, errors, operation_id
from einsora.api.errors import Unavailable
from einsora.api.schemas.common import ErrorBody
from einsora.api.schemas.events import CHANGE, EVENT_DATA, SNAPSHOT
from einsora.api.services import workloads

REF = "#/components/schemas/{model}"
ERROR_REF = REF.format(model=ErrorBody.__name__)

router = APIRouter(tags=["events"], generate_unique_id_function=operation_id)

LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        description="Resume after this event (the `id` of the last one received): every later "
        "event comes once, none twice; one no longer held brings a fresh `snapshot`",
        max_length=64,
    ),
]

STREAM_TEXT = (
    f"Server-sent events (`{MEDIA_TYPE}`). Each event has an `id` (the EVENTS stream "
    "sequence; send the last one back as `Last-Event-ID` to resume) and a name: "
    f"`{SNAPSHOT}` first on a fresh stream (data: `SnapshotOut`, the current states), then "
    f"`{CHANGE}` for each change as the scheduler makes it (data: `WorkloadChangeOut`). A frame "
    "with an `id` and no data moves the id on past a change the snapshot already showed. "
    "`: ping` comments keep a silent stream open. At most `api_streams_per_token` (8) streams "
    "per user in a tenant, all their API tokens and dashboard sessions together (429 past it)."
)


def stream_responses(*statuses: int, page: bool = False) -> dict[int | str, dict[str, Any]]:
    """The document's answers of a stream route: the event stream (beside the JSON page of a
    route that answers one without `follow`), and its errors, which are JSON."""
    json_errors = {
        status: {
            "description": answer["description"],
            "content": {"application/json": {"schema": {"$ref": ERROR_REF}}},
        }
        for status, answer in errors(*AUTH_ERRORS, *PARAM_ERRORS, *statuses).items()
    }
    text = f"A page of the timeline (JSON); with `follow=true`: {STREAM_TEXT}" if page else ""
    return {
        200: {
            "description": text or STREAM_TEXT,
            "content": {
                MEDIA_TYPE: {
                    # Each event, as Open API 3.1 describes an event stream (3.2: itemSchema).
                    "schema": {
                        "type": "object",
                        "properties": {
                            "event": {"type": "string", "enum": list(EVENT_DATA)},
                            "id": {"type": "string", "pattern": "^[0-9]+$"},
                            "retry": {"type": "integer", "minimum": 0},
                            "data": {
                                "type": "string",
                                "contentMediaType": "application/json",
                                "contentSchema": {
                                    "oneOf": [
                                        {"$ref": REF.format(model=model.__name__)}
                                        for model in EVENT_DATA.values()
                                    ]
                                },
                            },
                        },
                    },
                    "example": 'id: 42\nevent: workload\ndata: {"seq": 42, "workload_id": …}\n\n',
                }
            },
        },
        **json_errors,
    }


def _streams(request: Request) -> EventStreams:
    streams: EventStreams | None = request.app.state.ctx.streams
    if streams is None:
        raise Unavailable("this api serves no event streams (it runs without the bus)")
    return streams


async def follow(
    request: Request, call: Call, workload_id: str | None, last_event_id: str | None
) -> Response:
    """The event stream of one workload (or, with None, every workload of the tenant)."""
    after = parse_last_event_id(last_event_id)
    streams = _streams(request)
    if request.method == "HEAD":
        # What GET would answer, without holding a stream no body will ever be read from.
        if workload_id is not None:
            await workloads.get(call.ctx.store, call.me, workload_id)
        return Response(status_code=200, media_type=MEDIA_TYPE)
    stream = await streams.open(call.me, workload_id, after)
    return EventStreamResponse(stream)


@router.get(
    "/v1/events",
    summary="Follow every change to the tenant's workloads (server-sent events: a `snapshot`, "
    "then each `workload` change; resume with Last-Event-ID)",
    response_class=EventStreamResponse,
    responses=stream_responses(),
)
async def stream_events(request: Request, call: Me, last_event_id: LastEventId = None) -> Response:
    return await follow(request, call, None, last_event_id)
