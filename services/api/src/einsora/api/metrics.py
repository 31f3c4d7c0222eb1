"""Prometheus metrics of the api: requests and latency by route template and status.

Each app has its own registry, so several apps in one process (tests, Solo) never clash, and
`/metrics` shows only this api's figures. The route label is the template (`/v1/workloads/{id}`)
so the number of series stays bounded whatever the ids. `/metrics` is served by `metrics_app` on
a port of its own (loopback by default), never on the API's port, which anyone may reach.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

UNMATCHED = "<unmatched>"
METRICS_PATH = "/metrics"

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ApiMetrics:
    """The api's counters and histograms, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "einsora_api_requests",
            "HTTP requests answered, by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "einsora_api_request_duration_seconds",
            "Time to answer an HTTP request, by method, route template and status",
            ["method", "route", "status"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            labels = (method, route, str(status))
            children = (self._requests.labels(*labels), self._latency.labels(*labels))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def metrics_app(metrics: ApiMetrics) -> ASGIApp:
    """The ASGI app of the metrics port: `GET /metrics`, and 404 for anything else."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        response: Response
        if scope["path"] == METRICS_PATH and scope["method"] in ("GET", "HEAD"):
            response = Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
        else:
            response = PlainTextResponse("not found; metrics are at /metrics", status_code=404)
        await response(scope, receive, send)

    return app
