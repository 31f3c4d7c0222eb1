"""Prometheus `/metrics` for every service: a registry of its own, served on a port of its own.

Each service keeps its figures in its own `CollectorRegistry`, so several services in one
process (Solo, tests) never clash and each `/metrics` shows only that service. The page is
served by prometheus-client's own HTTP server on a thread, on loopback unless the operator says
otherwise (`EINSORA_METRICS_HOST`), never on a port the public reaches. A service whose port
setting is unset serves none.

Names follow Prometheus's conventions (`promtool check metrics` passes on every service): base
units in the name (`_seconds`), counters ending in `_total`, `einsora_<service>_` prefixes.
"""

from __future__ import annotations

import errno
import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from einsora.common.errors import PortInUse

log = logging.getLogger("einsora.metrics")

CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Histogram buckets for the control plane's short waits (a cycle, a KV write's ack)."""


def new_registry() -> CollectorRegistry:
    """A service's own registry."""
    return CollectorRegistry(auto_describe=True)


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus's text format."""
    return generate_latest(registry)


class MetricsServer:
    """`/metrics` of one registry over HTTP, on a thread of its own."""

    def __init__(self, registry: CollectorRegistry, *, service: str, setting: str) -> None:
        self._registry = registry
        self._service = service
        self._setting = setting
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        """The port it listens on once started (the chosen one when asked for port 0)."""

    def start(self, host: str, port: int) -> None:
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self._registry)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(
                    f"cannot serve {self._service} metrics on {host}:{port}: the port is taken; "
                    f"choose another with {self._setting}"
                ) from exc
            raise
        self.port = int(self._server.server_port)
        log.info(
            "metrics listening",
            extra={"service": self._service, "url": f"http://{host}:{self.port}/metrics"},
        )

    def stop(self) -> None:
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(5)


def serve(
    registry: CollectorRegistry, *, host: str, port: int | None, service: str, setting: str
) -> MetricsServer | None:
    """Start `/metrics` for `service` when its port is set (0: any free port); else None."""
    if port is None:
        return None
    server = MetricsServer(registry, service=service, setting=setting)
    server.start(host, port)
    return server
