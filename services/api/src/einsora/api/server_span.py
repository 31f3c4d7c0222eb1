"""The api's server span: one per HTTP request while tracing is on (ADR-0020).

The root of the request's trace, or the child of the caller's `traceparent`; named
`{method} {route}` once the router has matched (`POST /v1/workloads`), with the HTTP
semantic-convention attributes an operator filters on. The edge (`middleware.py`, inside this
one) names the request's ID on it.

OpenTelemetry's ASGI instrumentation did this before, and cost the api about a sixth of its
event loop under a burst of launches even with 90 % of requests sampled out: it collects a
dozen attributes, parses the URL and wraps the app twice before the sampler has decided. Here
a sampled-out request costs the sampler's decision and one context switch; attributes are set
only on a span that records. Added only while tracing is on.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from einsora.common import telemetry

UNTRACED = frozenset({"/healthz", "/readyz"})
"""Probes: a trace a second each, telling nobody anything."""


class ServerSpanMiddleware:
    """One server span per HTTP request, current while the app handles it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._tracer = telemetry.tracer("einsora.api")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        caller = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                caller = value.decode("latin-1")
                break
        span = self._tracer.start_span(
            method, context=telemetry.context_of(caller), kind=SpanKind.SERVER
        )
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with trace.use_span(span, end_on_exit=True):
            try:
                await self.app(scope, receive, send_status)
            finally:
                if span.is_recording():
                    # The router matched in place: the route's template is on the same scope.
                    route = getattr(scope.get("route"), "path", None)
                    span.update_name(f"{method} {route}" if route else method)
                    span.set_attributes(
                        {
                            "http.request.method": method,
                            "url.scheme": scope.get("scheme", "http"),
                            "url.path": scope["path"],
                            "http.response.status_code": status,
                        }
                    )
                    if route:
                        span.set_attribute("http.route", route)
                    if status >= 500 or status == 0:
                        span.set_status(StatusCode.ERROR)
