"""What every route may use: settings, the store, the catalog, the machines view, the bus."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from einsora.api.machines import MachinesView
from einsora.api.metrics import ApiMetrics
from einsora.api.store import Store
from einsora.common.catalog import Catalog
from einsora.common.schemas import utcnow
from einsora.common.settings import Settings


def _never() -> bool:
    return False


@dataclass
class ApiContext:
    """Built once by the service and handed to `create_app`."""

    settings: Settings
    store: Store
    catalog: Catalog
    machines: MachinesView
    metrics: ApiMetrics = field(default_factory=lambda: ApiMetrics())
    bus_connected: Callable[[], bool] = _never
    clock: Callable[[], datetime] = utcnow
    """Now, for access tickets' expiry (injectable so tests can move time)."""
