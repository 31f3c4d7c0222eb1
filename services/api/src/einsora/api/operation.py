"""One declared API operation: its path, models, auth, and the thin edge that runs it.

Each router declares its `Operation`s; this module turns one into a Starlette route that
authenticates, applies the token's rate limits, parses the query and the body (its size is
limited as it is read, by `middleware.py`) with the operation's own pydantic models, calls the
handler, and shapes the reply. The same declarations generate /openapi.json (`openapi.py`), so
the document cannot drift from what is validated.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from einsora.api.auth import Principal, authenticate
from einsora.api.context import ApiContext
from einsora.api.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Unavailable,
    Unprocessable,
    error_response,
)
from einsora.api.schemas.common import NoBody, NoQuery, as_details
from einsora.api.services.limits import RateLimits
from einsora.common import logs
from einsora.common.errors import EinsoraError

log = logging.getLogger("einsora.api.http")

_TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

BodyT = TypeVar("BodyT", bound=BaseModel)
QueryT = TypeVar("QueryT", bound=BaseModel)
Reply = BaseModel | Response | None


@dataclass
class Call(Generic[BodyT, QueryT]):
    """What a handler gets: the parsed body and query, who is calling, and the service."""

    ctx: ApiContext
    request: Request
    request_id: str
    body: BodyT
    query: QueryT
    principal: Principal | None = None

    @property
    def me(self) -> Principal:
        """The authenticated principal (every operation with `auth=True` has one)."""
        if self.principal is None:
            raise RuntimeError("this operation is not authenticated")
        return self.principal

    def path(self, name: str) -> str:
        value: str = self.request.path_params[name]
        return value

    def header(self, name: str) -> str | None:
        return self.request.headers.get(name)

    @property
    def traceparent(self) -> str | None:
        value = self.request.headers.get("traceparent")
        return value if value and _TRACEPARENT_RE.match(value) else None


Handler = Callable[[Call[Any, Any]], Awaitable[Reply]]


@dataclass(frozen=True)
class HeaderParam:
    """A request header an operation reads, documented in /openapi.json."""

    name: str
    description: str
    pattern: str


@dataclass(frozen=True)
class Operation:
    """One method on one path, with the models that validate it and describe it."""

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    response: type[BaseModel] | None = None
    status: int = 200
    body: type[BaseModel] | None = None
    query: type[BaseModel] = NoQuery
    auth: bool = True
    errors: tuple[int, ...] = ()
    headers: tuple[HeaderParam, ...] = ()
    in_schema: bool = True
    media_type: str = "application/json"
    extra_responses: Mapping[int, type[BaseModel]] = field(default_factory=dict)
    launch: bool = False
    """Counts against the token's launches per minute as well as its requests."""

    @property
    def operation_id(self) -> str:
        return self.handler.__name__.strip("_")


def routes(operations: Sequence[Operation], ctx: ApiContext) -> list[Route]:
    """One Starlette route per path, so a wrong method's 405 lists every allowed one."""
    by_path: dict[str, dict[str, Operation]] = {}
    for op in operations:
        by_path.setdefault(op.path, {})[op.method] = op
    rate_limits = RateLimits.from_settings(ctx.settings)
    return [_route(path, ops, ctx, rate_limits) for path, ops in by_path.items()]


def _route(path: str, ops: dict[str, Operation], ctx: ApiContext, limits: RateLimits) -> Route:
    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await _run(ops[method], ctx, limits, request)

    endpoint.__name__ = "_".join(op.operation_id for op in ops.values())
    return Route(path, endpoint, methods=list(ops))


async def _run(op: Operation, ctx: ApiContext, limits: RateLimits, request: Request) -> Response:
    request_id: str = request.scope["state"]["request_id"]
    try:
        principal = None
        if op.auth:
            principal = await authenticate(ctx.store, request.headers.get("authorization"))
            request.scope["einsora.tenant"] = principal.tenant_id
            request.scope["einsora.subject"] = principal.user_id
            await limits.check(principal, launch=op.launch)
        with logs.bind(
            tenant=principal.tenant_id if principal else None,
            subject=principal.user_id if principal else None,
        ):
            query = _parse_query(op.query, request)
            body: BaseModel = NoBody()
            if op.body is not None:
                body = _parse_body(op.body, await read_body(request))
            call: Call[Any, Any] = Call(ctx, request, request_id, body, query, principal)
            reply = await op.handler(call)
    except ApiError as exc:
        return error_response(exc, request_id)
    except IntegrityError as exc:
        log.info("conflicting write refused", extra={"error": str(exc.orig)})
        return error_response(Conflict("this conflicts with an existing object"), request_id)
    except DataError as exc:
        log.warning("value refused by the store", extra={"error": str(exc.orig)})
        return error_response(Unprocessable("a value could not be stored"), request_id)
    except (DBAPIError, SQLAlchemyError) as exc:
        log.warning("store unavailable", extra={"error": repr(exc)})
        return error_response(Unavailable("the store did not answer; retry shortly"), request_id)
    except EinsoraError as exc:
        if exc.retryable:
            return error_response(Unavailable(exc.message), request_id)
        log.exception("request failed")
        return error_response(ApiError("internal error; quote the request ID"), request_id)
    except Exception:
        log.exception("request failed")
        return error_response(ApiError("internal error; quote the request ID"), request_id)
    return _render(reply, op)


def _render(reply: Reply, op: Operation) -> Response:
    if reply is None:
        return Response(status_code=204)
    if isinstance(reply, Response):
        return reply
    return Response(reply.model_dump_json(), status_code=op.status, media_type=op.media_type)


async def read_body(request: Request) -> bytes:
    """The request body; past `middleware.MAX_BODY_BYTES` its reading raises PayloadTooLarge."""
    chunks: list[bytes] = []
    try:
        async for chunk in request.stream():
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadRequest(
            "the client went away before sending the whole body", code="client_disconnected"
        ) from None
    return b"".join(chunks)


def _parse_body(model: type[BodyT], raw: bytes) -> BodyT:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        bad_json = [e for e in errors if e["type"] == "json_invalid"]
        if bad_json:
            reason = bad_json[0].get("ctx", {}).get("error", "not JSON")
            raise BadRequest(f"malformed JSON: {reason}", code="malformed_json") from None
        raise _unprocessable(errors) from None


def _parse_query(model: type[QueryT], request: Request) -> QueryT:
    if model is NoQuery:
        return model()
    try:
        return model.model_validate(dict(request.query_params))
    except ValidationError as exc:
        raise _unprocessable(exc.errors(include_url=False, include_input=False)) from None


def _unprocessable(errors: list[Any]) -> Unprocessable:
    details = as_details(errors)
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:3])
    if len(details) > 3:
        summary += f"; and {len(details) - 3} more"
    return Unprocessable(summary, details=details)
