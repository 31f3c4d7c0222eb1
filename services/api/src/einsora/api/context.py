"""What every route may use: settings, the store, the catalog, the machines view, the bus, and
every tool the service made for them (the projections, accounting's client, the event streams,
the rate limits). Routes reach them here alone (issue 37): nothing else hangs off the app."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from einsora.api.auth import VerifiedTokens
from einsora.api.consumers.revocations import Revocations
from einsora.api.consumers.streams import EventStreams
from einsora.api.metrics import ApiMetrics
from einsora.api.passwords import SignInThrottle
from einsora.api.projections.enrolments import EnrolmentsSync
from einsora.api.projections.gateway_keys import GatewayKeysSync
from einsora.api.projections.model_fallbacks import ModelFallbacksSync
from einsora.api.projections.quotas import QuotasSync
from einsora.api.services.limits import RateLimits
from einsora.api.services.usage import Accounting
from einsora.api.store import Store
from einsora.api.views.machines import MachinesView
from einsora.api.views.regions import RegionsView
from einsora.common.catalog import Catalog
from einsora.common.schemas import utcnow
from einsora.common.settings import Settings


def _never() -> bool:
    return False


class BusAuth(Protocol):
    """What revocation needs of the bus: cut a machine's live connections (the callout)."""

    async def kick(self, machine_id: str) -> int: ...


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
    gateway_keys: GatewayKeysSync | None = None
    """Writes gateway keys for the gateway (None: no bus)."""
    quotas: QuotasSync | None = None
    """Writes tenant quotas for the scheduler, reads tenants' use (None: no bus)."""
    enrolments: EnrolmentsSync | None = None
    """Writes machines' enrolments (None: no bus)."""
    bus_auth: BusAuth | None = None
    """The auth callout, which cuts a revoked machine's connections (None: not serving it)."""
    accounting: Accounting | None = None
    """Asks accounting for usage reports (None: no bus)."""
    streams: EventStreams | None = None
    """Serves events as server-sent streams (None: no bus)."""
    sign_in_throttle: SignInThrottle = field(default_factory=SignInThrottle)
    """Failed password sign-ins (ADR-0019)."""
    rate_limits: RateLimits = field(init=False)
    """Each caller's and each address's request rate (from the settings)."""

    def __post_init__(self) -> None:
        self.rate_limits = RateLimits.from_settings(self.settings)

    async def revoked(self, token_ids: list[str]) -> None:
        """These tokens were revoked: refused from the next request on, here and elsewhere."""
        if self.revocations is None:
            self.tokens.forget(token_ids)
        else:
            await self.revocations.revoked(token_ids)
