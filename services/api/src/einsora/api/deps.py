"""What the api's routes depend on: who calls, the api's context, a JSON body, trace headers;
and how a route answers and documents its errors.

`Me` authenticates the request's API token (`auth.authenticate`), names its tenant and subject
for the access log and the metrics, counts the request against the token's rate limits, binds
tenant and subject to every later log line of the request, and gives the route a `Call`: the
principal, the `ApiContext` the app was made over (`app.state.ctx`) and the request ID. `Launch`
is the same for a launch, which counts against the token's launches per minute too. `Ctx` is
the ApiContext alone, for the few routes that authenticate no one. On a mutating request each
of them arms the request's activity-log action (`store.Action`) with its route and caller.

`JsonBody(Model)` reads the body, within `MAX_BODY_BYTES` as it streams, and validates it with
the model's own JSON parser: strict (no `"1"` for 1), whatever the Content-Type, a body that is
not JSON being a 400 and not a 422. FastAPI's own body parsing is not used: it decodes with
Python's `json` (which lets lone surrogates through), validates the decoded objects in Python
mode (where a strict model refuses an enum's own value) and answers an empty or non-JSON body
with a 422. The document takes each request body from these dependencies (`app.py`).

Every dependency is `async def` (FastAPI runs a plain `def` in a thread) and one layer deep
(each layer costs microseconds on every request). Routes return a ready `Response` (`reply`),
which FastAPI passes through without validating and serialising it a second time; their
`response_model` and `responses` are for the document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Depends, Header, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Scope

from einsora.api.auth import Principal, authenticate
from einsora.api.context import ApiContext
from einsora.api.errors import BadRequest, unprocessable
from einsora.api.middleware import ACTION_SCOPE_KEY, MAX_BODY_BYTES, MUTATING, bind_log_context
from einsora.api.schemas.common import ErrorBody, as_details
from einsora.api.services.activity import action_name
from einsora.api.session_auth import (
    authenticate_session,
    check_csrf,
    require_same_origin,
    session_cookie,
)
from einsora.api.store import Action
from einsora.common import telemetry

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Call:
    """An authenticated request, as a route gets it: who makes it (`me`), the api's context and
    the request's ID. One dependency gives all three: each FastAPI dependency costs some 14 us
    a request (measured), more than anything a route does with them."""

    me: Principal
    ctx: ApiContext
    request_id: str


async def _authenticated(request: Request, *, launch: bool) -> Call:
    scope = request.scope
    ctx: ApiContext = request.app.state.ctx
    authorization = request.headers.get("authorization")
    secret = session_cookie(scope, ctx.settings.public_url) if authorization is None else None
    if secret is not None:
        principal = await _session(scope, ctx, secret)
    else:
        principal = await authenticate(ctx.store, authorization, ctx.tokens, now=ctx.clock())
    scope["einsora.tenant"] = principal.tenant_id
    scope["einsora.subject"] = principal.user_id
    # Bound until the request ends, by the edge; a `yield` dependency would cost some 30 us a
    # request more (FastAPI's exit stack and cancel scopes around it).
    bind_log_context(scope, tenant=principal.tenant_id, subject=principal.user_id)
    await ctx.rate_limits.check(principal, launch=launch)
    action: Action | None = scope.get(ACTION_SCOPE_KEY)
    if action is not None:
        # Armed past the rate limits: a refused flood writes no rows.
        action.tenant_id, action.user_id = principal.tenant_id, principal.user_id
        action.token_id = principal.token_id
        _arm(action, scope, ctx)
    return Call(principal, ctx, scope["state"]["request_id"])


SESSION_SCOPE_KEY = "einsora.session"
"""The scope key of the session secret a request was authenticated with (the session routes
answer with its CSRF token)."""


async def _session(scope: Scope, ctx: ApiContext, secret: str) -> Principal:
    """A dashboard session's principal (`session_auth.py`); a change made with it must come
    from the dashboard's own origin, with the session's CSRF token."""
    settings = ctx.settings
    if scope["method"] in MUTATING:
        require_same_origin(scope, settings.public_url)
    principal = await authenticate_session(
        ctx.store,
        secret,
        ctx.tokens,
        now=ctx.clock(),
        idle=timedelta(hours=settings.session_idle_hours),
    )
    if scope["method"] in MUTATING:
        check_csrf(scope, secret)
    scope[SESSION_SCOPE_KEY] = secret
    return principal


TARGET_CHARS = 128
"""The activity log's `target` column (`models.activity`)."""


def _arm(action: Action, scope: Mapping[str, Any], ctx: ApiContext) -> None:
    """Arm the request's action with its route: from here its first write records it."""
    route = scope.get("route")
    if not isinstance(route, APIRoute):
        return
    params: Mapping[str, Any] = scope.get("path_params") or {}
    # The innermost id of the path is what the route acts on (the invitation of a tenant's);
    # as the caller sent it, so bounded to the column (a hostile one is refused, and recorded).
    target = str(list(params.values())[-1])[:TARGET_CHARS] if params else None
    action.arm(
        ctx.store,
        name=action_name(route.name),
        route=f"{action.method} {route.path_format}",
        at=ctx.clock(),
        status=route.status_code or 200,
        target=target,
    )


async def authenticated(request: Request) -> Call:
    """The caller, authenticated and within its token's rate limits."""
    return await _authenticated(request, launch=False)


async def launching(request: Request) -> Call:
    """The caller of a launch: `authenticated`, counted against launches per minute as well."""
    return await _authenticated(request, launch=True)


async def context(request: Request) -> ApiContext:
    """The ApiContext the app was made over, for a route that authenticates no one (its
    action is armed without a caller: the route's service names who acts, `activity_actor`),
    within its client address's rate limit (`limits.RateLimits.check_address`)."""
    ctx: ApiContext = request.app.state.ctx
    await ctx.rate_limits.check_address(request.scope)
    action: Action | None = request.scope.get(ACTION_SCOPE_KEY)
    if action is not None:
        _arm(action, request.scope, ctx)
    return ctx


Me = Annotated[Call, Depends(authenticated)]
Launch = Annotated[Call, Depends(launching)]
Ctx = Annotated[ApiContext, Depends(context)]

AUTHENTICATED = (authenticated, launching)
"""The dependencies that make an operation authenticated (documented with `bearer`)."""


async def read_body(request: Request) -> bytes:
    """The request body; past `MAX_BODY_BYTES` its reading raises PayloadTooLarge."""
    chunks: list[bytes] = []
    try:
        async for chunk in request.stream():
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadRequest(
            "the client went away before sending the whole body", code="client_disconnected"
        ) from None
    return b"".join(chunks)


class JsonBody(Generic[M]):
    """A dependency: the request body, validated as JSON by `model` (400 if it is not JSON,
    422 naming each field that breaks the model)."""

    def __init__(self, model: type[M]) -> None:
        self.model = model

    async def __call__(self, request: Request) -> M:
        raw = await read_body(request)
        try:
            return self.model.model_validate_json(raw)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            bad_json = [e for e in errors if e["type"] == "json_invalid"]
            if bad_json:
                reason = bad_json[0].get("ctx", {}).get("error", "not JSON")
                raise BadRequest(f"malformed JSON: {reason}", code="malformed_json") from None
            raise unprocessable(as_details(errors)) from None


TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
_TRACEPARENT_RE = re.compile(TRACEPARENT_PATTERN)

Traceparent = Annotated[
    str | None,
    Header(
        description="W3C trace context, carried on to the intent; one that is not well-formed "
        "is ignored, never refused",
        json_schema_extra={"pattern": TRACEPARENT_PATTERN},
    ),
]


def traceparent_of(value: str | None) -> str | None:
    """The trace context the request's intent carries on: while tracing is on, the request's
    own span (its HTTP instrumentation already took the caller's `traceparent` as its parent);
    else the caller's header when it is well-formed, else None (W3C: ignore, never refuse)."""
    if telemetry.ON:
        current = telemetry.current_traceparent()
        if current is not None:
            return current
    return value if value is not None and _TRACEPARENT_RE.match(value) else None


def reply(body: BaseModel, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """`body` as JSON, ready: FastAPI sends a returned Response as it is."""
    return Response(
        body.model_dump_json(), status_code=status, headers=headers, media_type="application/json"
    )


def no_content() -> Response:
    return Response(status_code=204)


ERROR_TEXT = {
    400: "Malformed JSON",
    401: "Missing, unknown, revoked or expired API token (or dashboard session)",
    403: "Not allowed to do this",
    404: "No such object in this tenant",
    409: "The object's state or an existing object forbids this",
    413: f"Body over {MAX_BODY_BYTES // 1024} KiB",
    422: "A field breaks the schema; `details` names it",
    429: "Over a rate limit of your account, or of your address where no token is taken "
    "(`details` names it); retry after `Retry-After` s",
    503: "The store or the bus cannot answer now",
}

AUTH_ERRORS = (401, 403, 429, 503)
"""What `Me` and `Launch` may answer (403: a change made with a dashboard session from
another site, or without its CSRF token)."""
BODY_ERRORS = (400, 413, 422)
"""What `JsonBody` may answer."""
PARAM_ERRORS = (422,)
"""What a route with path, query or header parameters may answer (FastAPI documents a 422 for
every route with parameters; a path parameter that is a plain string never causes one)."""


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of an operation that may answer these error statuses."""
    return {
        status: {"model": ErrorBody, "description": ERROR_TEXT[status]}
        for status in sorted(set(statuses))
    }


def operation_id(route: APIRoute) -> str:
    """An operation's id is its endpoint's name (`create_workload`)."""
    return route.name
