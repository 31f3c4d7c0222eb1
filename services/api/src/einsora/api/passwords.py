"""Dashboard passwords: Argon2id hashes (argon2-cffi), computed off the event loop, and a
throttle on failed sign-ins.

Argon2id with argon2-cffi's defaults (RFC 9106's second recommendation: 3 passes over 64 MiB,
4 lanes) takes some 90 ms of CPU here, so hashing runs on a pool of its own, two at a time: a
flood of sign-ins costs at most 128 MiB and two cores, never the event loop. A sign-in for a
user who does not exist, or has no password, verifies against a dummy hash all the same, so the
time taken does not say which usernames exist.

Sign-in attempts are counted per username and per client address in the store, so that every
api replica shares them, and each attempt takes its place there (one conditional UPDATE) before
its password is checked: a burst of guesses, however concurrent, has at most
`MAX_FAILURES_PER_USER` of them checked (`MAX_FAILURES_PER_ADDRESS` per address) in `WINDOW_S`;
the rest, the right password among them, are refused with a 429 until the window passes. A right
password gives its attempt back. The client's address is the connection's, or what a proxy of
`trusted_proxies` says it forwarded (issue 34, N5). The owner can always sign in with a one-time
link (`einsora dashboard`), which the throttle does not touch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import sqlalchemy as sa
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.api.errors import RateLimited
from einsora.api.store import Store, insert_ignore

MIN_LENGTH = 12
MAX_LENGTH = 1024

_HASHER = PasswordHasher()
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="argon2")
_DUMMY: list[str] = []


async def hash_password(password: str) -> str:
    """The Argon2id hash of `password`, in PHC string form (salt and parameters included)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, _HASHER.hash, password)


def _verify(stored: str | None, password: str) -> bool:
    if stored is None:
        if not _DUMMY:
            _DUMMY.append(_HASHER.hash("not a password anyone has"))
        stored = _DUMMY[0]
        with contextlib.suppress(VerificationError):
            _HASHER.verify(stored, password)
        return False
    try:
        return _HASHER.verify(stored, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def verify_password(stored: str | None, password: str) -> bool:
    """Whether `password` matches the stored hash (None: the user has none, and the answer is
    False after as long as a real check takes)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, _verify, stored, password)


def needs_rehash(stored: str) -> bool:
    """Whether a hash was made with weaker parameters than today's (rehash on sign-in)."""
    try:
        return _HASHER.check_needs_rehash(stored)
    except InvalidHashError:
        return True


MAX_FAILURES_PER_USER = 10
MAX_FAILURES_PER_ADDRESS = 50
WINDOW_S = 600.0
KEY_CHARS = 255
"""`sign_in_attempts.key`: a username is at most 64 characters, an address far less."""

_a = m.sign_in_attempts


class SignInThrottle:
    """Password sign-in attempts per username and per client address, in fixed windows, counted
    in the store (so every api replica shares them)."""

    def __init__(
        self,
        per_user: int = MAX_FAILURES_PER_USER,
        per_address: int = MAX_FAILURES_PER_ADDRESS,
        window_s: float = WINDOW_S,
    ) -> None:
        self._limits = {"user": per_user, "address": per_address}
        self._window = timedelta(seconds=window_s)
        self._purged_at = -math.inf

    async def claim(self, store: Store, username: str, address: str, now: datetime) -> None:
        """Take this attempt's place in its username's window and its address's, before its
        password is checked, or refuse it (429) when either is full. Both or neither: a refused
        attempt is counted nowhere."""
        cutoff = now - self._window
        async with store.write_aside() as conn:
            if time.monotonic() - self._purged_at >= self._window.total_seconds():
                # Windows that passed count for nothing: their rows go, now and then.
                self._purged_at = time.monotonic()
                await conn.execute(sa.delete(_a).where(_a.c.window_start <= cutoff))
            for kind, key in (("user", username), ("address", address)):
                await self._take(conn, kind, key[:KEY_CHARS], now, cutoff, username)

    async def _take(
        self,
        conn: AsyncConnection,
        kind: str,
        key: str,
        now: datetime,
        cutoff: datetime,
        username: str,
    ) -> None:
        limit = self._limits[kind]
        first = {"kind": kind, "key": key, "window_start": now, "attempts": 0}
        await conn.run_sync(lambda sync: insert_ignore(sync, _a, first, keys=["kind", "key"]))
        passed = _a.c.window_start <= cutoff
        taken = await conn.execute(
            sa.update(_a)
            .where(_a.c.kind == kind, _a.c.key == key, sa.or_(passed, _a.c.attempts < limit))
            .values(
                attempts=sa.case((passed, 1), else_=_a.c.attempts + 1),
                window_start=sa.case((passed, now), else_=_a.c.window_start),
            )
        )
        if taken.rowcount == 1:
            return
        started = await conn.scalar(
            sa.select(_a.c.window_start).where(_a.c.kind == kind, _a.c.key == key)
        )
        left = (started or now) + self._window - now
        retry = max(1, math.ceil(left.total_seconds()))
        what = f"user {username}" if kind == "user" else "your address"
        raise RateLimited(
            f"too many failed sign-ins for {what}; retry in {retry} s, or sign in with a "
            "one-time link (`einsora dashboard`)",
            details=[
                {
                    "field": "password",
                    "message": f"{limit} failed sign-ins per "
                    f"{self._window.total_seconds() / 60:g} minutes",
                    "type": "rate_limit",
                }
            ],
            headers={"Retry-After": str(retry)},
        )

    async def succeeded(self, store: Store, username: str, address: str) -> None:
        """A right password: its username's count starts again, and its attempt no longer
        counts against its address (an office behind one address is not locked out by its
        people signing in)."""
        async with store.write_aside() as conn:
            await conn.execute(
                sa.delete(_a).where(_a.c.kind == "user", _a.c.key == username[:KEY_CHARS])
            )
            await conn.execute(
                sa.update(_a)
                .where(_a.c.kind == "address", _a.c.key == address[:KEY_CHARS], _a.c.attempts > 0)
                .values(attempts=_a.c.attempts - 1)
            )
