"""`/v1/workloads/{id}/export`: one workload's inputs, placements, timeline and usage as one
JSON document (`einsora.workload-export/v1`), secrets redacted and listed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from einsora.api.deps import AUTH_ERRORS, PARAM_ERRORS, Me, errors, operation_id, reply
from einsora.api.schemas.export import WorkloadExportOut
from einsora.api.services import export
from einsora.api.services.usage import Accounting

router = APIRouter(tags=["workloads"], generate_unique_id_function=operation_id)


@router.get(
    "/v1/workloads/{id}/export",
    summary="Export a workload: its inputs, placements, complete timeline and usage, every "
    "secret replaced by REDACTED and listed in `redactions`",
    response_model=WorkloadExportOut,
    responses=errors(*AUTH_ERRORS, *PARAM_ERRORS, 404),
)
async def export_workload(
    call: Me, request: Request, workload_id: Annotated[str, Path(alias="id")]
) -> Response:
    # Without a bus (or accounting) the export still answers, saying in `notes` what it lacks.
    accounting: Accounting | None = request.app.state.ctx.accounting
    ctx = call.ctx
    return reply(await export.export(ctx.store, accounting, call.me, workload_id, ctx.clock()))
