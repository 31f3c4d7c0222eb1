"""The model table: each tenant's running endpoint replicas by model name, from `routes`.

The scheduler writes one route per running replica (several replicas of an endpoint share its
tenant and name) and deletes it the moment it decides to park or stop that replica, so a
replica leaves the table before it goes away. Only endpoint routes with a name are kept; the
rest of the bucket (notebooks, VMs) is the proxy's.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import ValidationError

from einsora.common.bus import KvMirror, names
from einsora.common.schemas import Route, WorkloadKind
from einsora.common.targets import OwnPorts

log = logging.getLogger("einsora.gateway.routes")

AUDIT_S = 30.0
Model = tuple[str, str]
"""(tenant id, model name)."""


class ModelTable:
    """Running replicas by (tenant, model name), kept current by a KV mirror of `routes`."""

    def __init__(self, *, audit_s: float = AUDIT_S, own_ports: OwnPorts | None = None) -> None:
        self._audit_s = audit_s
        self.own_ports = own_ports or OwnPorts(frozenset())
        """The control plane's own ports: a route naming one is refused (ADR-0026)."""
        self._routes: dict[str, Route] = {}
        self._replicas: dict[Model, tuple[Route, ...]] = {}
        self._models: dict[str, tuple[str, ...]] = {}
        self._mirror: KvMirror | None = None

    def replicas(self, tenant_id: str, model: str) -> tuple[Route, ...]:
        """The running replicas of a tenant's model (empty: none is running)."""
        return self._replicas.get((tenant_id, model), ())

    def models(self, tenant_id: str) -> tuple[str, ...]:
        """A tenant's model names with at least one running replica, sorted."""
        return self._models.get(tenant_id, ())

    async def start(self, nc: NATS, js: JetStreamContext, *, sync_timeout_s: float) -> None:
        """Load every route, then follow changes (returns once loaded, or after the timeout
        with the mirror still trying: the scheduler creates the bucket)."""
        self._mirror = KvMirror(
            nc,
            js,
            names.ROUTES,
            on_put=self._put,
            on_delete=self._delete,
            audit_s=self._audit_s,
        )
        try:
            await self._mirror.start(sync_timeout_s=sync_timeout_s)
        except TimeoutError:
            log.warning(
                "routes not loaded yet (is the scheduler up? it creates the bucket); "
                "no model is served until they are"
            )

    async def stop(self) -> None:
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            await mirror.stop()

    def _put(self, key: str, value: bytes) -> None:
        try:
            route = Route.from_bytes(value)
        except ValidationError:
            # Treated as gone: sending a tenant's prompts to an address we cannot read is not safe.
            log.warning("unreadable route ignored", extra={"workload": key})
            self._delete(key)
            return
        if route.kind is not WorkloadKind.endpoint or not route.name:
            self._delete(key)
            return
        why = self.own_ports.first_refusal([route.port, *route.ports.values()])
        if why is not None:
            # Whatever wrote it: a tenant's prompts never go to the control plane's own ports.
            log.warning("route refused", extra={"workload": key, "why": why})
            self._delete(key)
            return
        old = self._routes.get(key)
        self._routes[key] = route
        if old is not None and old.tenant_id != route.tenant_id:
            self._reindex(old.tenant_id)
        self._reindex(route.tenant_id)

    def _delete(self, key: str) -> None:
        route = self._routes.pop(key, None)
        if route is not None:
            log.info("replica removed", extra={"workload": key, "model": route.name})
            self._reindex(route.tenant_id)

    def _reindex(self, tenant_id: str) -> None:
        # Rebuilt per tenant on each change, so a request reads a ready tuple (changes are rare,
        # requests are many).
        by_model: dict[str, list[Route]] = defaultdict(list)
        for key in sorted(self._routes):
            route = self._routes[key]
            if route.tenant_id == tenant_id:
                by_model[route.name].append(route)
        for model in [m for (t, m) in self._replicas if t == tenant_id and m not in by_model]:
            del self._replicas[(tenant_id, model)]
        for model, routes in by_model.items():
            self._replicas[(tenant_id, model)] = tuple(routes)
        if by_model:
            self._models[tenant_id] = tuple(sorted(by_model))
        else:
            self._models.pop(tenant_id, None)
