"""Prometheus metrics of accounting, in a registry of their own, served on their own port.

- `einsora_allocations_open`: allocations open now;
- `einsora_gpu_seconds_metered_total{tenant,class}`: GPU-seconds of the allocations closed
  since this process started, by tenant and placed class (an allocation counts when it closes;
  its whole length then);
- `einsora_events_metered_total`: workload events that opened or closed an allocation;
- the durable consumers' redeliveries and terminations (einsora.common.bus.consumer).

`/metrics` listens on loopback by default (`api_metrics_host`), never on a public port.
"""

from __future__ import annotations

import errno
import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from einsora.accounting.model import Applied
from einsora.common.errors import PortInUse

log = logging.getLogger("einsora.accounting.metrics")


class AccountingMetrics:
    """Accounting's gauges and counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.allocations_open = Gauge(
            "einsora_allocations_open", "Allocations open now", registry=self.registry
        )
        self.gpu_seconds = Counter(
            "einsora_gpu_seconds_metered",
            "GPU-seconds of the allocations closed, by tenant and placed class",
            ["tenant", "class"],
            registry=self.registry,
        )
        self.events_metered = Counter(
            "einsora_events_metered",
            "Workload events that opened or closed an allocation",
            registry=self.registry,
        )

    def took(self, applied: Applied) -> None:
        """Count what a committed batch of events did."""
        self.allocations_open.inc(applied.opened - applied.closed)
        self.events_metered.inc(applied.metered)
        for (tenant, klass), seconds in applied.gpu_seconds.items():
            self.gpu_seconds.labels(tenant, klass).inc(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """`/metrics` over HTTP, on a thread of its own (prometheus-client's server)."""

    def __init__(self, metrics: AccountingMetrics) -> None:
        self._metrics = metrics
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        """The port it listens on once started (the chosen one when asked for port 0)."""

    def start(self, host: str, port: int) -> None:
        try:
            self._server, self._thread = start_http_server(
                port, addr=host, registry=self._metrics.registry
            )
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(
                    f"cannot serve accounting metrics on {host}:{port}: the port is taken; "
                    "choose another with EINSORA_ACCOUNTING_METRICS_PORT"
                ) from exc
            raise
        self.port = int(self._server.server_port)
        log.info("accounting metrics listening", extra={"url": f"http://{host}:{self.port}"})

    def stop(self) -> None:
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(5)
