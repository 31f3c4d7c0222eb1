"""`/v1/workloads/{id}/access`: a one-time link that opens a running workload in the browser."""

from __future__ import annotations

from starlette.responses import Response

from einsora.api.operation import Call, Operation
from einsora.api.schemas.access import AccessOut
from einsora.api.schemas.common import NoBody, NoQuery
from einsora.api.services import access


async def create_access(call: Call[NoBody, NoQuery]) -> Response:
    out = await access.mint(
        call.ctx.store,
        call.ctx.settings,
        call.me,
        call.path("id"),
        request_id=call.request_id,
        clock=call.ctx.clock,
    )
    return Response(
        out.model_dump_json(),
        status_code=201,
        media_type="application/json",
        # The link is a credential for 60 s: never cache it, never leak it onward.
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )


OPERATIONS = [
    Operation(
        "POST",
        "/v1/workloads/{id}/access",
        create_access,
        "A one-time link (valid 60 s) to a running workload's own site, for the browser",
        "workloads",
        AccessOut,
        status=201,
        errors=(404, 409),
    ),
]
