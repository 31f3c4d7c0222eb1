"""The route table: where each running workload answers, from the `routes` bucket.

The scheduler writes a workload's route when it is running and deletes it when it stops. The
proxy keeps a copy in memory through a `KvMirror` of the whole bucket, so the table survives a
NATS restart (even one that lost its store) and a route that vanished while the proxy was not
looking still counts as deleted: a deleted route ends that site's sessions and closes its
WebSockets at once, which is how access is revoked.

A route is believed only about the workload's own ports (ADR-0026): one that names a port of
the control plane's own, a privileged port, or more ports than a workload has, is treated as
gone, with one log line, whatever wrote it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import ValidationError

from einsora.common.bus import KvMirror, names, provision
from einsora.common.schemas import Route
from einsora.common.targets import OwnPorts

log = logging.getLogger("einsora.proxy.routes")

AUDIT_S = 30.0
MAX_PORTS = 8
"""The most ports one route may name besides its own (a VM has three: ssh, console, http)."""


class RouteTable:
    """Routes by workload id, kept current by a KV mirror."""

    def __init__(
        self,
        on_removed: Callable[[str], object],
        *,
        audit_s: float = AUDIT_S,
        own_ports: OwnPorts | None = None,
    ):
        self.own_ports = own_ports or OwnPorts(frozenset())
        """The control plane's own ports: a route naming one is refused (targets.py)."""
        self._routes: dict[str, Route] = {}
        self._refused: set[str] = set()
        """Routes refused, so each is logged once until it changes."""
        self._on_removed = on_removed
        self._audit_s = audit_s
        self._mirror: KvMirror | None = None

    def get(self, workload_id: str) -> Route | None:
        return self._routes.get(workload_id)

    async def start(self, nc: NATS, js: JetStreamContext, *, replicas: int = 1) -> None:
        """Load every route, then follow changes (returns once the routes are loaded)."""

        async def ensure() -> None:
            # A server restarted without its store has no bucket until someone provisions it.
            await provision(js, replicas=replicas, only=(names.ROUTES.stream,))

        self._mirror = KvMirror(
            nc,
            js,
            names.ROUTES,
            on_put=self._put,
            on_delete=self._delete,
            audit_s=self._audit_s,
            ensure=ensure,
        )
        await self._mirror.start()

    async def stop(self) -> None:
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            await mirror.stop()

    def _put(self, key: str, value: bytes) -> None:
        try:
            route = Route.from_bytes(value)
        except ValidationError:
            # Treated as gone: serving a workload from a route we cannot read is not safe.
            log.warning("unreadable route ignored", extra={"workload": key})
            self._delete(key)
            return
        why = self.refusal(route)
        if why is not None:
            if key in self._routes or key not in self._refused:
                log.warning("route refused", extra={"workload": key, "why": why})
            self._refused.add(key)
            self._delete(key)
            return
        self._refused.discard(key)
        self._routes[key] = route

    def refusal(self, route: Route) -> str | None:
        """Why the proxy will not follow `route` (None: it will)."""
        if len(route.ports) > MAX_PORTS:
            return f"it names {len(route.ports)} ports, more than a workload has ({MAX_PORTS})"
        return self.own_ports.first_refusal([route.port, *route.ports.values()])

    def _delete(self, key: str) -> None:
        if self._routes.pop(key, None) is not None:
            log.info("route removed", extra={"workload": key})
        self._on_removed(key)
