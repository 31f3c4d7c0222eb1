"""Dashboard passwords: Argon2id hashes (argon2-cffi), computed off the event loop, and a
throttle on failed sign-ins.

Argon2id with argon2-cffi's defaults (RFC 9106's second recommendation: 3 passes over 64 MiB,
4 lanes) takes some 90 ms of CPU here, so hashing runs on a pool of its own, two at a time: a
flood of sign-ins costs at most 128 MiB and two cores, never the event loop. A sign-in for a
user who does not exist, or has no password, verifies against a dummy hash all the same, so the
time taken does not say which usernames exist.

Failed sign-ins are counted per username and per client address in this process's memory; past
`MAX_FAILURES_PER_USER` (or `MAX_FAILURES_PER_ADDRESS`) in `WINDOW_S`, sign-ins for it are
refused with a 429 until the window passes. The owner can always sign in with a one-time link
(`einsora dashboard`), which the throttle does not touch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from einsora.api.errors import RateLimited

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


class SignInThrottle:
    """Failed password sign-ins per username and per client address, in fixed windows."""

    def __init__(
        self,
        per_user: int = MAX_FAILURES_PER_USER,
        per_address: int = MAX_FAILURES_PER_ADDRESS,
        window_s: float = WINDOW_S,
    ) -> None:
        self._limits = {"user": per_user, "address": per_address}
        self._window_s = window_s
        self._failures: dict[tuple[str, str], deque[float]] = {}

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        failures = self._failures.get(key)
        if failures is None:
            return deque()
        while failures and now - failures[0] >= self._window_s:
            failures.popleft()
        if not failures:
            del self._failures[key]
        return failures

    def check(self, username: str, address: str) -> None:
        """Refuse (429) a sign-in for a username or from an address past its failures."""
        now = time.monotonic()
        for kind, value in (("user", username), ("address", address)):
            failures = self._recent((kind, value), now)
            if len(failures) >= self._limits[kind]:
                retry = max(1, int(self._window_s - (now - failures[0])) + 1)
                what = f"user {username}" if kind == "user" else "your address"
                raise RateLimited(
                    f"too many failed sign-ins for {what}; retry in {retry} s, or sign in with "
                    "a one-time link (`einsora dashboard`)",
                    details=[
                        {
                            "field": "password",
                            "message": f"{self._limits[kind]} failed sign-ins per "
                            f"{self._window_s / 60:g} minutes",
                            "type": "rate_limit",
                        }
                    ],
                    headers={"Retry-After": str(retry)},
                )

    def failed(self, username: str, address: str) -> None:
        now = time.monotonic()
        if len(self._failures) > 100_000:
            self._failures.clear()  # a flood of distinct names: start again rather than grow
        for key in (("user", username), ("address", address)):
            self._failures.setdefault(key, deque()).append(now)

    def succeeded(self, username: str) -> None:
        self._failures.pop(("user", username), None)
