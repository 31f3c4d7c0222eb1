"""Prometheus metrics of accounting, in a registry of their own, served on their own port.

- `einsora_allocations_open`: allocations open now;
- `einsora_gpu_seconds_metered_total{tenant,class}`: GPU-seconds of the allocations closed
  since this process started, by tenant and placed class (an allocation counts when it closes;
  its whole length then; a close a late event moves earlier is not taken back from it);
- `einsora_events_metered_total`: workload events that opened or closed an allocation;
- the durable consumers' redeliveries and terminations (einsora.common.bus.consumer).

`/metrics` is served by `einsora.common.metrics`, on loopback by default, never on a public port.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from einsora.accounting.model import Applied
from einsora.common import metrics


class AccountingMetrics:
    """Accounting's gauges and counters."""

    def __init__(self) -> None:
        self.registry = metrics.new_registry()
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
            # A counter never goes down: a close a late event moved earlier is not taken back.
            if seconds > 0:
                self.gpu_seconds.labels(tenant, klass).inc(seconds)

    def render(self) -> bytes:
        return metrics.render(self.registry)
