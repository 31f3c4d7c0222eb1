"""The edge of every HTTP request: its request ID, its body's limit, its log context, its
metrics, its access log, and the headers every answer carries. (Its head's limits, and the
answer to bytes that are not HTTP at all, come before it: `protocols.py`.)

An incoming `X-Request-ID` is kept only if it is short and safe (it ends up in logs and message
headers); otherwise a new one is made. Every response carries it, and every log line written
while handling the request has it (with the tenant and subject once authenticated, which the
principal's dependency binds with `bind_log_context`). Pure ASGI, so it adds no task or
buffering per request. A failure the app's exception handlers did not answer is answered here,
as a 500 with the error body and the request ID (`errors.api_error_of`). Every answer says
`X-Content-Type-Options: nosniff`: a JSON error that quotes what a caller sent must never be
taken by a browser for a page or a script.

A mutating request (POST, PUT, PATCH, DELETE) gets its activity-log action here, bound for the
request and armed by the route's dependency (`store.py` says how it is written); the edge
settles it as the answer starts, before the caller can read the log, so every armed request
leaves exactly one row that says how it ended.

A body is limited while it is read, before anything parses it: a declared `Content-Length` over
`MAX_BODY_BYTES` is refused at once, and a streamed body as soon as its bytes pass the limit, so
no request can make the one event loop parse megabytes. A body framed two ways (`Content-Length`
and `Transfer-Encoding`, the shape of request smuggling) is refused, and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import ExitStack

from opentelemetry import trace
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from einsora.api.errors import ApiError, BadRequest, PayloadTooLarge, api_error_of, error_response
from einsora.api.metrics import UNMATCHED, ApiMetrics
from einsora.api.protocols import FRAMED_TWICE
from einsora.api.store import Action, bound, settle
from einsora.common import logs, telemetry
from einsora.common.ids import new_id

log = logging.getLogger("einsora.api.access")

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

MAX_BODY_BYTES = 128 * 1024
"""The largest request body read: twice a spec's limit (64 KiB), room for a launch's other
fields and a client's indentation. No route takes more."""


_BOUND = "einsora.log_context"
"""The scope key of the request's ExitStack of log bindings (`bind_log_context`)."""

ACTION_SCOPE_KEY = "einsora.action"
"""The scope key of a mutating request's activity-log action (armed by `deps.py`)."""

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def bind_log_context(scope: Scope, **fields: str) -> None:
    """Add `fields` to every later log line of this request, until it ends: what is known only
    inside it (the tenant and subject, once authenticated). Call it from the request's own task,
    as async dependencies and routes are: the edge unbinds them in that task's context."""
    bound: ExitStack | None = scope.get(_BOUND)
    if bound is not None:
        bound.enter_context(logs.bind(**fields))


def request_id_from(value: str | None) -> str:
    """The caller's request ID when it is short and safe, else a new one."""
    if value and REQUEST_ID_RE.match(value):
        return value
    return new_id("request")


def _refusal(headers: list[tuple[bytes, bytes]]) -> ApiError | None:
    """Why a request is refused on its headers alone, before its body is read, or None."""
    length: bytes | None = None
    chunked = False
    for name, value in headers:
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            chunked = True
    error: ApiError | None = None
    if length is not None and chunked:
        error = BadRequest(FRAMED_TWICE, code="ambiguous_framing")
    elif length is not None and not length.isdigit():  # h11 lets none through; others may
        error = BadRequest("Content-Length must be a number of bytes", code="malformed_request")
    if error is not None:
        error.headers = {"Connection": "close"}  # what follows cannot be told from a body
        return error
    if length is not None and int(length) > MAX_BODY_BYTES:
        return PayloadTooLarge(
            f"the body is {int(length)} bytes; the limit is {MAX_BODY_BYTES} bytes"
        )
    return None


class EdgeMiddleware:
    """Request ID, body limit, log context, metrics and the access log for every request."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        request_id = request_id_from(incoming)
        scope.setdefault("state", {})["request_id"] = request_id
        if telemetry.ON:
            # The HTTP instrumentation's server span started before the ID was known.
            trace.get_current_span().set_attribute(telemetry.REQUEST_ID_ATTRIBUTE, request_id)
        status = 500
        responded = False
        started = time.perf_counter()
        received = 0

        action: Action | None = None
        if scope["method"] in MUTATING:
            action = scope[ACTION_SCOPE_KEY] = Action(
                request_id, scope["method"], asyncio.current_task()
            )

        async def send_with_id(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                status = message["status"]
                responded = True
                headers = MutableHeaders(scope=message)
                headers.append("X-Request-ID", request_id)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                if action is not None and action.armed:
                    await settle(action, status)  # before the caller can read the log
            await send(message)

        async def receive_bounded() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    # An ApiError, so the route reading the body answers it as any other.
                    raise PayloadTooLarge(f"the body is over the limit of {MAX_BODY_BYTES} bytes")
            return message

        with logs.bind(request_id=request_id), ExitStack() as bindings:
            scope[_BOUND] = bindings
            if action is not None:
                bindings.enter_context(bound(action))
            try:
                refusal = _refusal(scope["headers"])
                if refusal is not None:
                    await error_response(refusal, request_id)(scope, receive, send_with_id)
                    return
                try:
                    await self.app(scope, receive_bounded, send_with_id)
                except Exception as exc:
                    # What the app's handlers did not answer: a body over the limit read
                    # outside a route, or a failure nothing expected (logged, answered 500).
                    if responded:
                        raise  # answered already; nothing more can be said
                    error = api_error_of(exc)
                    await error_response(error, request_id)(scope, receive, send_with_id)
            finally:
                elapsed = time.perf_counter() - started
                route = scope.get("route")
                template = getattr(route, "path", None)
                self.metrics.observe(scope["method"], template or UNMATCHED, status, elapsed)
                with logs.bind(
                    tenant=scope.get("einsora.tenant"), subject=scope.get("einsora.subject")
                ):
                    log.info(
                        "%s %s %s",
                        scope["method"],
                        scope["path"],
                        status,
                        extra={"status": status, "ms": round(elapsed * 1000, 2)},
                    )
