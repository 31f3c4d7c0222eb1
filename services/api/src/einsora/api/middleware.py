"""The edge of every HTTP request: its request ID, its body's limit, its log context, its
metrics, its access log; and the JSON answer to bytes that are not HTTP at all.

An incoming `X-Request-ID` is kept only if it is short and safe (it ends up in logs and message
headers); otherwise a new one is made. Every response carries it, and every log line written
while handling the request has it (with the tenant and subject once authenticated). Pure ASGI,
so it adds no task or buffering per request.

A body is limited while it is read, before anything parses it: a declared `Content-Length` over
`MAX_BODY_BYTES` is refused at once, and a streamed body as soon as its bytes pass the limit, so
no request can make the one event loop parse megabytes. A body framed two ways (`Content-Length`
and `Transfer-Encoding`, the shape of request smuggling) is refused, and the connection closed.
"""

from __future__ import annotations

import logging
import re
import time

import h11
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from einsora.api.errors import ApiError, BadRequest, PayloadTooLarge, error_body, error_response
from einsora.api.metrics import UNMATCHED, ApiMetrics
from einsora.common import logs
from einsora.common.ids import new_id

log = logging.getLogger("einsora.api.access")

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

MAX_BODY_BYTES = 128 * 1024
"""The largest request body read: twice a spec's limit (64 KiB), room for a launch's other
fields and a client's indentation. No operation takes more."""


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
        error = BadRequest(
            "the body is framed twice (Content-Length and Transfer-Encoding); send one",
            code="ambiguous_framing",
        )
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
        status = 500
        responded = False
        started = time.perf_counter()
        received = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                status = message["status"]
                responded = True
                MutableHeaders(scope=message).append("X-Request-ID", request_id)
            await send(message)

        async def receive_bounded() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    # An ApiError, so the operation reading the body answers it as any other.
                    raise PayloadTooLarge(f"the body is over the limit of {MAX_BODY_BYTES} bytes")
            return message

        with logs.bind(request_id=request_id):
            try:
                refusal = _refusal(scope["headers"])
                if refusal is not None:
                    await error_response(refusal, request_id)(scope, receive, send_with_id)
                    return
                try:
                    await self.app(scope, receive_bounded, send_with_id)
                except PayloadTooLarge as exc:
                    if responded:
                        raise  # answered already; nothing more can be said
                    await error_response(exc, request_id)(scope, receive, send_with_id)
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


class EdgeH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, answering what h11 cannot parse (a negative Content-Length,
    a malformed header) with the api's JSON error and a request ID instead of plain text."""

    def send_400_response(self, msg: str) -> None:
        request_id = new_id("request")
        error = BadRequest(
            "malformed HTTP request: its request line, a header or the body's framing is not "
            "valid HTTP/1.1 (a Content-Length that is not a number of bytes, say)",
            code="malformed_request",
        )
        body = error_body(error, request_id)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"x-request-id", request_id.encode()),
        ]
        with logs.bind(request_id=request_id):
            log.info("malformed HTTP request refused", extra={"status": 400})
        try:
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:
            pass  # a response was under way already: closing is all that is left
        self.transport.close()
