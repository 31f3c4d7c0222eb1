"""Short, prefixed, sortable ids: `w-…` for workloads, `m-…` for machines.

An id is a prefix, 10 characters of milliseconds since the epoch and 10 random characters, in a
lowercase base-32 alphabet. Lowercase matters: a workload id is also a DNS label
(`w-<id>.localhost`), and ids sort by creation time as plain strings.
"""

from __future__ import annotations

import re
import secrets
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
}

_ID_RE = re.compile(rf"^(?P<prefix>[a-z]+)-[{_ALPHABET}]{{{_TIME_CHARS + _RANDOM_CHARS}}}$")


def _encode(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        value, rem = divmod(value, 32)
        chars.append(_ALPHABET[rem])
    return "".join(reversed(chars))


def new_id(kind: str, *, now_ms: int | None = None) -> str:
    """A new id for an object of `kind` (a key of PREFIXES), e.g. `new_id("workload")`."""
    prefix = PREFIXES[kind]
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = secrets.randbits(5 * _RANDOM_CHARS)
    return f"{prefix}-{_encode(ms, _TIME_CHARS)}{_encode(rand, _RANDOM_CHARS)}"


def is_id(value: str, kind: str) -> bool:
    """Whether `value` is a canonical id of `kind` (exact case, no padding)."""
    match = _ID_RE.match(value)
    return bool(match) and match is not None and match["prefix"] == PREFIXES[kind]
