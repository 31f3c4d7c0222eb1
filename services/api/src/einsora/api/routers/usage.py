"""`/v1/usage`: GPU-hours, CPU-core-hours and tokens, summed by a group, as JSON or CSV."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from einsora.api.deps import AUTH_ERRORS, PARAM_ERRORS, Me, errors, operation_id, reply
from einsora.api.errors import Unavailable
from einsora.api.schemas.usage import CSV_COLUMNS, UsageQuery, UsageReportOut
from einsora.api.services import usage

router = APIRouter(tags=["usage"], generate_unique_id_function=operation_id)

CSV = "text/csv"
JSON = "application/json"

_CSV_DOCUMENTED = {
    "description": "The report; as CSV (`Accept: text/csv`) its header row is "
    + ",".join(CSV_COLUMNS),
    "content": {CSV: {"schema": {"type": "string"}}},
}


def _accounting(request: Request) -> usage.Accounting:
    """The service's client of accounting (`service.py` sets it); an app without a bus has none."""
    found: usage.Accounting | None = request.app.state.ctx.accounting
    if found is None:
        raise Unavailable("usage reports come from accounting, and this api has no bus")
    return found


def wants_csv(accept: str | None) -> bool:
    """Whether `Accept` prefers CSV to JSON (by q, then by order; JSON when it says neither)."""
    if not accept:
        return False
    best: tuple[float, int, str] | None = None
    for index, part in enumerate(accept.split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        kind = CSV if media.lower() == CSV else JSON if media.lower() in (JSON, "*/*") else None
        if kind is None:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > 0 and (best is None or (q, -index) > (best[0], best[1])):
            best = (q, -index, kind)
    return best is not None and best[2] == CSV


@router.get(
    "/v1/usage",
    summary="Usage in a window of time, summed by tenant, user, class, workload, region or day",
    response_model=UsageReportOut,
    responses={200: _CSV_DOCUMENTED, **errors(*AUTH_ERRORS, *PARAM_ERRORS, 404)},
)
async def get_usage(call: Me, request: Request, query: Annotated[UsageQuery, Query()]) -> Response:
    found = await usage.report(
        call.ctx.store, _accounting(request), call.me, query, call.ctx.clock()
    )
    if wants_csv(request.headers.get("accept")):
        return Response(usage.as_csv(found), media_type=CSV)
    return reply(found)
