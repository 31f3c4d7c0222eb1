"""Short, prefixed, sortable ids: `w-…` for workloads, `m-…` for machines.

An id is a prefix, 10 characters of milliseconds since the epoch and 10 random characters, in a
lowercase base-32 alphabet. Lowercase matters: a workload id is also a DNS label
(`w-<id>.localhost`), and ids sort by creation time as plain strings.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base-32, lowercase
_TIME_CHARS = 10
_RANDOM_CHARS = 10

PREFIXES = {
    "workload": "w",
    "machine": "m",
    "tenant": "t",
    "user": "u",
    "token": "tok",
    "event": "ev",
    "intent": "in",
    "request": "req",
    "invitation": "inv",
    "gateway_key": "gk",
    "join_token": "jt",
    "machine_invitation": "mi",
    "session": "ses",
    "sign_in_link": "sil",
}

_POOL_BYTES = 4096
_DRAW_BYTES = 7  # 56 bits drawn, the id keeps 5 * _RANDOM_CHARS = 50 of them


class _Entropy(threading.local):
    """This thread's bytes from the OS's CSPRNG, and how many are used."""

    def __init__(self) -> None:
        self.pool = b""
        self.used = 0


_entropy = _Entropy()


def _forget_entropy() -> None:
    # A forked child must not hand out the ids its parent will: its pool is a copy.
    global _entropy
    _entropy = _Entropy()


os.register_at_fork(after_in_child=_forget_entropy)


def _random_bits() -> int:
    """5 * _RANDOM_CHARS bits from `os.urandom`, read 4 KiB at a time.

    Each `os.urandom` is a syscall that releases the GIL; on a busy api the event loop then
    waits up to the interpreter's switch interval (5 ms) to take it back from the store's
    writer thread. One read per id (three per launch) was 4 % of the api's samples under a
    burst (py-spy); one per 585 ids is nothing. The bytes are as unpredictable as before.
    """
    entropy = _entropy
    if entropy.used + _DRAW_BYTES > len(entropy.pool):
        entropy.pool, entropy.used = os.urandom(_POOL_BYTES), 0
    start = entropy.used
    entropy.used = start + _DRAW_BYTES
    drawn = int.from_bytes(entropy.pool[start : start + _DRAW_BYTES], "big")
    return drawn >> (8 * _DRAW_BYTES - 5 * _RANDOM_CHARS)


_ID_RE = re.compile(rf"^(?P<prefix>[a-z]+)-[{_ALPHABET}]{{{_TIME_CHARS + _RANDOM_CHARS}}}$")


_PAIRS = tuple(a + b for a in _ALPHABET for b in _ALPHABET)
"""Every two-digit string, by the 10 bits it encodes."""


def _encode(value: int, width: int) -> str:
    """`value`'s last `width` (even) base-32 digits, two per lookup: a digit at a time (20
    `divmod`s an id) was 2 % of a busy api's time."""
    pairs = _PAIRS
    return "".join([pairs[(value >> shift) & 1023] for shift in range(5 * width - 10, -1, -10)])


def new_id(kind: str, *, now_ms: int | None = None) -> str:
    """A new id for an object of `kind` (a key of PREFIXES), e.g. `new_id("workload")`."""
    prefix = PREFIXES[kind]
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    ms &= (1 << 5 * _TIME_CHARS) - 1
    return (
        f"{prefix}-{_encode(ms << 5 * _RANDOM_CHARS | _random_bits(), _TIME_CHARS + _RANDOM_CHARS)}"
    )


def is_id(value: str, kind: str) -> bool:
    """Whether `value` is a canonical id of `kind` (exact case, no padding)."""
    match = _ID_RE.match(value)
    return bool(match) and match is not None and match["prefix"] == PREFIXES[kind]


def derived_id(kind: str, *parts: str) -> str:
    """The same id of `kind` every time for the same `parts` (an intent a scheduler republishes
    must keep its id across replays, so JetStream and the next scheduler apply it once). Its
    characters are a hash, not a time: it does not sort by creation."""
    digest = int.from_bytes(hashlib.sha256("\x00".join(parts).encode()).digest()[:13], "big")
    return f"{PREFIXES[kind]}-{_encode(digest, _TIME_CHARS + _RANDOM_CHARS)}"
