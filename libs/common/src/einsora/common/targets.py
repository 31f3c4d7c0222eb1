"""Where a route may point: a workload's own ports, never the control plane's.

A route's host and ports come, in the end, from a machine's report, and a machine is believed
only about itself (ADR-0026). The scheduler points a direct machine's routes at its enrolled
address, whatever the agent said; and the scheduler, the proxy (HTTP and the SSH bridge) and the
gateway each refuse a route port that is one of the control plane's own (api, proxy, gateway,
NATS, tunnel hub, metrics, the store), a privileged port, or no port at all. Workloads listen on
ports the OS handed out (`launch.free_port`: 32768 and up on Linux), so refusing those few
numbers on every host costs a real workload nothing and shuts the control plane's own doors to a
route that names them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from einsora.common.settings import Settings

LOWEST = 1024
"""Ports below this are privileged: no workload's driver opens one."""
STORE_PORTS = frozenset({5432, 3306})
"""PostgreSQL's and MySQL's default ports, refused whatever the database URL says."""


def _port_of(url: str | None) -> int | None:
    if not url:
        return None
    try:
        parts = urlsplit(url)
        return parts.port
    except ValueError:
        return None


@dataclass(frozen=True)
class OwnPorts:
    """The ports a route may never reach: the control plane's own, on any host."""

    ports: frozenset[int]

    @classmethod
    def of(cls, settings: Settings, *more: int | None) -> OwnPorts:
        """Every port `settings` names (listening ports, metrics, the NATS and database URLs,
        the public URL), and `more` (ports a service bound that settings left at 0)."""
        named: Iterable[int | None] = (
            settings.api_port,
            settings.proxy_port,
            settings.gateway_port,
            settings.nats_port,
            settings.tunnel_port,
            settings.api_metrics_port,
            settings.scheduler_metrics_port,
            settings.gateway_metrics_port,
            settings.proxy_metrics_port,
            settings.agent_metrics_port,
            settings.accounting_metrics_port,
            _port_of(settings.nats_url),
            _port_of(settings.agent_nats_url),
            _port_of(settings.database_url),
            _port_of(settings.public_url),
            _port_of(settings.gateway_public_url),
            *more,
        )
        return cls(frozenset(p for p in named if p) | STORE_PORTS)

    def with_ports(self, *more: int | None) -> OwnPorts:
        return OwnPorts(self.ports | {p for p in more if p})

    def refusal(self, port: int) -> str | None:
        """Why a route may not reach `port`, in words for a log line or a timeline note; None
        when it may."""
        if not LOWEST <= port <= 65535:
            return f"port {port} is not a port a workload's driver opens ({LOWEST}-65535)"
        if port in self.ports:
            return f"port {port} is one of the control plane's own"
        return None

    def first_refusal(self, ports: Iterable[int]) -> str | None:
        """The refusal of the first port of `ports` that may not be reached, if any."""
        for port in ports:
            why = self.refusal(port)
            if why is not None:
                return why
        return None
