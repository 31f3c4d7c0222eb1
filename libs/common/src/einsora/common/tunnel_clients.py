"""Reaching workloads behind a machine's tunnel: where the hub serves each route, and the HTTP
client sessions that use those sockets (ADR-0015).

The proxy's tunnel hub serves one unix socket per tunnelled route, at a path both the proxy and
the gateway compute from the route alone, so they need no coordination on one host. A request
for a tunnelled route goes through a client session of that socket's own; never to this host's
address of the same port.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from einsora.common.bus import names
from einsora.common.schemas import Route


def socket_path(tunnel_dir: Path, machine_id: str, port: int) -> Path:
    """Where a tunnelled route's forward listens: `<tunnel_dir>/<machine_id>/<port>.sock`."""
    if not names.is_subject_token(machine_id, max_length=100) or not 0 < port < 65536:
        raise ValueError(f"no tunnel socket for machine {machine_id!r} port {port}")
    return tunnel_dir / machine_id / f"{port}.sock"


class TunnelClients:
    """One keep-alive client session per tunnel socket; one whose socket is gone is closed."""

    def __init__(self, tunnel_dir: Path, timeout: aiohttp.ClientTimeout, sweep_s: float = 60):
        self._dir = tunnel_dir
        self.directory = tunnel_dir
        """Where the hub serves its sockets (for a raw stream to a port: `socket_path`)."""
        self._timeout = timeout
        self._sweep_s = sweep_s
        self._swept = time.monotonic()
        self._sessions: dict[Path, aiohttp.ClientSession] = {}

    async def session(self, route: Route) -> aiohttp.ClientSession:
        """The session that reaches `route` through its machine's tunnel."""
        if time.monotonic() - self._swept > self._sweep_s:
            self._swept = time.monotonic()
            for gone in [p for p in self._sessions if not p.exists()]:
                await self._sessions.pop(gone).close()
        try:
            path = socket_path(self._dir, route.machine_id, route.port)
        except ValueError as exc:
            raise aiohttp.ClientConnectionError(str(exc)) from exc
        if path not in self._sessions:
            self._sessions[path] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(str(path), limit=0),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._sessions[path]

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()
