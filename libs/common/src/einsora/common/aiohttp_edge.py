"""What the aiohttp services (proxy, gateway) add to their apps and clients for observability.

- a middleware counting each answered request by a bounded label (never the path itself) and
  status, for `/metrics`;
- while tracing is on, OpenTelemetry's own aiohttp instrumentation: the server middleware (a
  server span per request, the caller's `traceparent` its parent) and a client trace config (a
  span per upstream call, with `traceparent` injected). Neither is added while tracing is off.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from einsora.common import telemetry

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def counting_middleware(counter: Counter, label_of: Callable[[web.Request], str]) -> Any:
    """Count every answered request in `counter` by `label_of(request)` and status."""
    children: dict[tuple[str, int], Any] = {}

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            key = (label_of(request), status)
            child = children.get(key)
            if child is None:
                child = children[key] = counter.labels(key[0], str(status))
            child.inc()

    return count


_prepared: list[bool] = []


def tracing_middlewares() -> list[Any]:
    """While tracing is on: OpenTelemetry's aiohttp server middleware (a server span per
    request, the caller's `traceparent` its parent); none while it is off.

    The package's middleware reads state its instrumentor sets up (excluded URLs, its meters),
    and its instrumentor would swap `web.Application` for a subclass in the whole process (which
    aiohttp deprecates, and which would reach every app, a sim endpoint's too). So the
    instrumentor runs once and is taken back at once: its state stays, `web.Application` is
    aiohttp's own, and the middleware is added to our apps alone, explicitly.
    """
    if not telemetry.ON:
        return []
    from opentelemetry.instrumentation.aiohttp_server import (
        AioHttpServerInstrumentor,
        create_aiohttp_middleware,
    )

    if not _prepared:
        instrumentor = AioHttpServerInstrumentor()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            instrumentor.instrument(tracer_provider=telemetry.provider())
        instrumentor.uninstrument()
        _prepared.append(True)
    return [create_aiohttp_middleware(tracer_provider=telemetry.provider())]


def client_trace_configs() -> list[Any]:
    """OpenTelemetry's aiohttp client trace config while tracing is on; none otherwise."""
    if not telemetry.ON:
        return []
    from opentelemetry.instrumentation.aiohttp_client import create_trace_config

    return [create_trace_config(tracer_provider=telemetry.provider())]
