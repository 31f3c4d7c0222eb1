"""The key table: every live gateway key, from a mirror of the `gateway_keys` bucket.

The api publishes a key's hash (never the key) when it is created and deletes it when it is
revoked. The gateway hashes what a client presents and looks it up here, in memory: no API call
per request, and a revocation reaches every gateway replica as fast as the bucket's watch (well
under a second). A key is looked up by the SHA-256 of the whole `esk_…` string.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import ValidationError

from einsora.common.bus import KvMirror, names
from einsora.common.schemas import GatewayKey

log = logging.getLogger("einsora.gateway.keys")

KEY_PREFIX = "esk_"
_BEARER = "bearer "
AUDIT_S = 30.0


@dataclass(frozen=True, slots=True)
class Key:
    """A live key as a request needs it: the published value, with its checks precomputed."""

    value: GatewayKey
    expires_at: float | None
    """Unix seconds, or None: never."""
    models: frozenset[str] | None
    limited: bool
    """Whether it has a requests or tokens limit (if not, admission never touches the bus)."""

    @classmethod
    def of(cls, value: GatewayKey) -> Key:
        return cls(
            value=value,
            expires_at=value.expires_at.timestamp() if value.expires_at is not None else None,
            models=frozenset(value.models) if value.models is not None else None,
            limited=value.rpm is not None or value.tpm is not None,
        )

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


def key_hash(key: str) -> str:
    """What the api stores for a key: the SHA-256 (hex) of the whole `esk_…` string."""
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> str | None:
    """The `esk_…` key of an `Authorization: Bearer …` header, or None."""
    if not authorization or authorization[:7].lower() != _BEARER:
        return None
    key = authorization[7:].strip()
    return key if key.startswith(KEY_PREFIX) and len(key) <= 256 else None


class KeyTable:
    """Live keys by hash, kept current by a KV mirror of `gateway_keys`."""

    def __init__(self, clock: Callable[[], float], *, audit_s: float = AUDIT_S) -> None:
        self._clock = clock
        self._audit_s = audit_s
        self._by_hash: dict[str, Key] = {}
        self._hash_of: dict[str, str] = {}
        self._mirror: KvMirror | None = None

    def authenticate(self, authorization: str | None) -> Key | None:
        """The live key an `Authorization` header presents; None if missing, unknown, revoked
        or expired."""
        presented = bearer_key(authorization)
        if presented is None:
            return None
        key = self._by_hash.get(key_hash(presented))
        if key is None:
            return None
        if key.expires_at is not None and key.expires_at <= self._clock():
            return None
        return key

    def __len__(self) -> int:
        return len(self._by_hash)

    def __contains__(self, key_id: object) -> bool:
        """Whether the table holds the key `key_id` (live or expired; not revoked)."""
        return key_id in self._hash_of

    async def start(self, nc: NATS, js: JetStreamContext, *, sync_timeout_s: float) -> None:
        """Load every key, then follow changes (returns once loaded, or after the timeout with
        the mirror still trying: the api, which creates the bucket, may not be up yet)."""
        self._mirror = KvMirror(
            nc,
            js,
            names.GATEWAY_KEYS,
            on_put=self._put,
            on_delete=self._delete,
            audit_s=self._audit_s,
        )
        try:
            await self._mirror.start(sync_timeout_s=sync_timeout_s)
        except TimeoutError:
            log.warning(
                "gateway keys not loaded yet (is the api up? it creates the bucket); "
                "keys are refused until they are"
            )

    async def stop(self) -> None:
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            await mirror.stop()

    def _put(self, key_id: str, value: bytes) -> None:
        try:
            key = Key.of(GatewayKey.from_bytes(value))
        except ValidationError:
            # Refused rather than guessed at: a key we cannot read lets no one in.
            log.warning("unreadable gateway key ignored", extra={"key_id": key_id})
            self._delete(key_id)
            return
        old = self._hash_of.get(key_id)
        if old is not None and old != key.value.key_hash:
            self._by_hash.pop(old, None)
        self._hash_of[key_id] = key.value.key_hash
        self._by_hash[key.value.key_hash] = key

    def _delete(self, key_id: str) -> None:
        digest = self._hash_of.pop(key_id, None)
        if digest is not None:
            self._by_hash.pop(digest, None)
            log.info("gateway key revoked", extra={"key_id": key_id})
