"""HTTP routes, one module per noun; each declares its `OPERATIONS` (see `operation.py`)."""

from __future__ import annotations

from einsora.api.metrics import METRICS_PATH
from einsora.api.operation import Operation
from einsora.api.routers import access, catalog, health, limits, tenants, tokens, workloads


def all_operations() -> list[Operation]:
    return [
        # /metrics is served on a port of its own (`metrics.metrics_app`), never on this one.
        *(op for op in health.OPERATIONS if op.path != METRICS_PATH),
        *tenants.OPERATIONS,
        *limits.OPERATIONS,
        *tokens.OPERATIONS,
        *workloads.OPERATIONS,
        *access.OPERATIONS,
        *catalog.OPERATIONS,
    ]
