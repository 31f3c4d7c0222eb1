"""The edge of every HTTP request: its request ID, its log context, its metrics, its access log.

An incoming `X-Request-ID` is kept only if it is short and safe (it ends up in logs and message
headers); otherwise a new one is made. Every response carries it, and every log line written
while handling the request has it (with the tenant and subject once authenticated). Pure ASGI,
so it adds no task or buffering per request.
"""

from __future__ import annotations

import logging
import re
import time

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from einsora.api.metrics import UNMATCHED, ApiMetrics
from einsora.common import logs
from einsora.common.ids import new_id

log = logging.getLogger("einsora.api.access")

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def request_id_from(value: str | None) -> str:
    """The caller's request ID when it is short and safe, else a new one."""
    if value and REQUEST_ID_RE.match(value):
        return value
    return new_id("request")


class EdgeMiddleware:
    """Request ID, log context, metrics and the access log for every HTTP request."""

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
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append("X-Request-ID", request_id)
            await send(message)

        with logs.bind(request_id=request_id):
            try:
                await self.app(scope, receive, send_with_id)
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
