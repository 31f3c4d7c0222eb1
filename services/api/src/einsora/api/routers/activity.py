"""`/v1/activity`: the tenant's activity log, a page at a time or exported whole."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.responses import Response, StreamingResponse

from einsora.api.deps import AUTH_ERRORS, PARAM_ERRORS, Me, errors, operation_id, reply
from einsora.api.schemas.activity import (
    EXPORT_COLUMNS,
    ActivityExportQuery,
    ActivityPage,
    ActivityQuery,
    ExportFormat,
)
from einsora.api.services import activity

router = APIRouter(tags=["activity"], generate_unique_id_function=operation_id)

_MEDIA = {ExportFormat.jsonl: "application/jsonl", ExportFormat.csv: "text/csv"}

_EXPORT_DOCUMENTED = {
    "description": "Every entry of the filtered log, newest first: JSON lines (one `ActivityOut` "
    "a line), or CSV whose header row is " + ",".join(EXPORT_COLUMNS),
    "content": {media: {"schema": {"type": "string"}} for media in _MEDIA.values()},
}


@router.get(
    "/v1/activity",
    summary="The tenant's activity log, newest first: who did what, when, with which token, "
    "and how it ended (its admins and the operator)",
    response_model=ActivityPage,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404),
)
async def list_activity(call: Me, query: Annotated[ActivityQuery, Query()]) -> Response:
    return reply(await activity.list_activity(call.ctx.store, call.me, query))


@router.get(
    "/v1/activity/export",
    summary="The tenant's whole activity log (filtered as the list is), streamed as JSON lines "
    "or CSV",
    response_class=Response,
    responses={200: _EXPORT_DOCUMENTED, **errors(*AUTH_ERRORS, *PARAM_ERRORS, 403, 404)},
)
async def export_activity(call: Me, query: Annotated[ActivityExportQuery, Query()]) -> Response:
    chunks = await activity.export(call.ctx.store, call.me, query, query.format)
    filename = f"activity.{query.format.value}"
    return StreamingResponse(
        chunks,
        media_type=_MEDIA[query.format],
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
