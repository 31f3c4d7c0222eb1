"""Server-side sessions, one per redeemed ticket, each bound to one site.

The cookie carries a random session id; only its hash is kept here. A session ends when its
workload stops, parks or is removed (its route disappears), and after an idle time. Sessions live
in the proxy's memory: after a proxy restart a person opens the workload again with a new link,
which is the safe failure.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass
class Session:
    """A browser's right to use one site."""

    workload_id: str
    tenant_id: str | None
    user_id: str | None
    last_seen: float
    closers: list[Callable[[], object]] = field(default_factory=list)


class SessionStore:
    """Sessions by hashed id, with idle expiry on an injectable clock."""

    def __init__(self, idle_s: float = 12 * 3600, clock: Clock = time.monotonic):
        self._idle_s = idle_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def create(self, workload_id: str, tenant_id: str | None, user_id: str | None) -> str:
        session_id = secrets.token_urlsafe(32)
        self._sessions[_digest(session_id)] = Session(
            workload_id, tenant_id, user_id, last_seen=self._clock()
        )
        return session_id

    def get(self, session_id: str | None, workload_id: str) -> Session | None:
        """The live session for this site, or None (unknown, idle too long, other site)."""
        if not session_id:
            return None
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is None or session.workload_id != workload_id:
            return None
        now = self._clock()
        if now - session.last_seen > self._idle_s:
            self._end(key)
            return None
        session.last_seen = now
        return session

    def end_site(self, workload_id: str) -> int:
        """End every session of a site (its workload stopped); returns how many."""
        keys = [k for k, s in self._sessions.items() if s.workload_id == workload_id]
        for key in keys:
            self._end(key)
        return len(keys)

    def expire_idle(self) -> int:
        now = self._clock()
        keys = [k for k, s in self._sessions.items() if now - s.last_seen > self._idle_s]
        for key in keys:
            self._end(key)
        return len(keys)

    def _end(self, key: str) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            for close in session.closers:
                close()

    def __len__(self) -> int:
        return len(self._sessions)
