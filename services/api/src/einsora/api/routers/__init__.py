"""HTTP routes, one module per noun; each declares its `OPERATIONS` (see `operation.py`)."""

from __future__ import annotations

from einsora.api.operation import Operation
from einsora.api.routers import access, catalog, health, tenants, tokens, workloads


def all_operations() -> list[Operation]:
    return [
        *health.OPERATIONS,
        *tenants.OPERATIONS,
        *tokens.OPERATIONS,
        *workloads.OPERATIONS,
        *access.OPERATIONS,
        *catalog.OPERATIONS,
    ]
