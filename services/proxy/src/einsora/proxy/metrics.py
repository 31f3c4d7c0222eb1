"""Prometheus metrics of the access proxy, in a registry of its own.

- `einsora_proxy_requests_total{kind,status}`: requests answered (`http`, `websocket`, `enter`);
- `einsora_proxy_sessions`: sessions open now (cookies a ticket was redeemed for);
- `einsora_proxy_websockets_open`: WebSockets forwarded now.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import Counter, Gauge

from einsora.common import metrics
from einsora.common.sites import ENTER_PATH


def kind_of(request: web.Request) -> str:
    if request.path == ENTER_PATH:
        return "enter"
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return "websocket"
    return "http"


class ProxyMetrics:
    """The proxy's counters and gauges."""

    def __init__(self, sessions: Callable[[], int]) -> None:
        self.registry = metrics.new_registry()
        self.requests = Counter(
            "einsora_proxy_requests",
            "Requests the proxy answered, by kind (http, websocket, enter) and status",
            ["kind", "status"],
            registry=self.registry,
        )
        session_gauge = Gauge(
            "einsora_proxy_sessions", "Proxy sessions open now", registry=self.registry
        )
        session_gauge.set_function(lambda: float(sessions()))
        self.websockets = Gauge(
            "einsora_proxy_websockets_open",
            "WebSockets the proxy forwards now",
            registry=self.registry,
        )
