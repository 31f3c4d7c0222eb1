"""What every route may use: settings, the store, the catalog, the machines view, the bus."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from einsora.api.auth import VerifiedTokens
from einsora.api.machines import MachinesView
from einsora.api.metrics import ApiMetrics
from einsora.api.projections.model_fallbacks import ModelFallbacksSync
from einsora.api.regions import RegionsView
from einsora.api.revocations import Revocations
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
    regions: RegionsView = field(default_factory=RegionsView)
    """Each region's scheduler, alive or not, and its free capacity (ADR-0022)."""
    metrics: ApiMetrics = field(default_factory=lambda: ApiMetrics())
    bus_connected: Callable[[], bool] = _never
    clock: Callable[[], datetime] = utcnow
    """Now, for access tickets' expiry (injectable so tests can move time)."""
    tokens: VerifiedTokens = field(default_factory=VerifiedTokens)
    """API tokens verified lately (authentication without a query per request)."""
    revocations: Revocations | None = None
    """Tells the other replicas about a revoked token (None: no bus, this replica only)."""
    model_fallbacks: ModelFallbacksSync | None = None
    """Writes endpoints' model steps for the gateway (None: no bus; ADR-0022)."""

    async def revoked(self, token_ids: list[str]) -> None:
        """These tokens were revoked: refused from the next request on, here and elsewhere."""
        if self.revocations is None:
            self.tokens.forget(token_ids)
        else:
            await self.revocations.revoked(token_ids)
