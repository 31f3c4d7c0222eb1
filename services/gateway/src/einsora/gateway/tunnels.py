"""Reaching endpoint replicas behind a machine's tunnel: the proxy's hub serves one unix socket
per tunnelled route on this host (ADR-0015), and requests to it go through a client session of
its own. Used by forwarding and by token counting alike, so no request for a tunnelled replica
ever goes to this host's own address of the same port.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from einsora.common.bus import names
from einsora.common.schemas import Route


def tunnel_socket(tunnel_dir: Path, route: Route) -> Path:
    """The hub's socket for a tunnelled route; the same path as `einsora.proxy.tunnels`'s
    `socket_path` (the services import nothing of each other's)."""
    if not names.is_subject_token(route.machine_id, max_length=100):
        raise aiohttp.ClientConnectionError("a tunnelled route names no valid machine")
    return tunnel_dir / route.machine_id / f"{route.port}.sock"


class TunnelClients:
    """One keep-alive client session per tunnel socket; one whose socket is gone is closed."""

    def __init__(self, tunnel_dir: Path, timeout: aiohttp.ClientTimeout, sweep_s: float = 60):
        self._dir, self._timeout, self._sweep_s = tunnel_dir, timeout, sweep_s
        self._swept = time.monotonic()
        self._sessions: dict[Path, aiohttp.ClientSession] = {}

    async def session(self, route: Route) -> aiohttp.ClientSession:
        if time.monotonic() - self._swept > self._sweep_s:
            self._swept = time.monotonic()
            for gone in [p for p in self._sessions if not p.exists()]:
                await self._sessions.pop(gone).close()
        path = tunnel_socket(self._dir, route)
        if path not in self._sessions:
            connector = aiohttp.UnixConnector(str(path), limit=0)
            self._sessions[path] = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._sessions[path]

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()
