"""The `gateway_keys` bucket holds exactly the live gateway keys of the store.

The routes keep it so as they go: a new key is put once its unit commits (before the 201), a
revoked one deleted once its revocation commits (before the 204). A crash between the commit
and the bus, or a bus that was down or came back empty, leaves it wrong; so one pass runs at
start, on a period, after every reconnect, soon after a route could not reach the bus, and when
the next key expires: every live key (neither revoked nor expired) is put where the bucket
lacks it or holds something else, and every entry that is not a live key is deleted.

A pass reads the bucket first and the store second, and every write it makes is conditional on
the key's revision it read (`Nats-Expected-Last-Subject-Sequence`). A key revoked after the pass
read the store therefore cannot be put back: its revocation's delete changed the revision, and
the put is refused. A route's put of a new key is conditional on the key never having been
written, so a revocation that overtook it wins as well. A refused write is left to the next
pass, which sees the newer state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyWrongLastSequenceError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from einsora.api.errors import Unavailable
from einsora.api.services.gateway_keys import live_keys
from einsora.api.store import Store
from einsora.common.bus import KeyState, bind_bucket, names, read_bucket
from einsora.common.errors import BusUnavailable
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import GatewayKey, utcnow

log = logging.getLogger("einsora.api.gateway_keys")

SYNC_PERIOD_S = 60.0
"""How often a pass runs when nothing asks for one sooner."""

RECONNECT_POLL_S = 1.0
"""How often the loop looks whether the client reconnected (no I/O: a counter)."""

RETRY_S = 5.0
"""How soon a pass that failed, or that a route asked for, runs at most."""

READ_TIMEOUT_S = 10.0
"""The longest wait for the next entry while reading the bucket."""

_WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream's codes for a conditional write whose expected revision is not the subject's."""


@dataclass(frozen=True)
class SyncReport:
    """What one pass changed: the key ids it put and the bucket keys it deleted."""

    put: tuple[str, ...]
    deleted: tuple[str, ...]


class GatewayKeysSync:
    """Writes gateway keys to KV for the routes, and repairs the bucket (see the module).

    `passes` counts completed passes and `reports` keeps each pass that changed something
    (for tests and operators' logs).
    """

    def __init__(
        self,
        store: Store,
        nc: NATS,
        js: JetStreamContext,
        *,
        period_s: float = SYNC_PERIOD_S,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be positive")
        self._store = store
        self._nc = nc
        self._kv = bind_bucket(js, names.GATEWAY_KEYS)
        self._period_s = period_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._wanted = asyncio.Event()
        self._next_expiry: datetime | None = None
        self.passes = 0
        self.reports: list[SyncReport] = []

    async def start(self) -> None:
        """Run a first pass now (in the background) and then as the module says."""
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="gateway keys sync")

    async def stop(self) -> None:
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 10)
            except TimeoutError:
                log.warning("the gateway keys sync did not stop in time")

    async def published(self, key: GatewayKey) -> None:
        """Put a key whose unit has just committed. A failure is logged, never raised: the key
        is stored, and the pass this asks for puts it as soon as the bus takes it."""
        try:
            self._require_bus()
            # Revision 0: only if the key was never written, so an earlier revocation wins.
            await self._kv.update(names.gateway_key_key(key.key_id), key.to_bytes(), last=0)
        except KeyWrongLastSequenceError:
            pass  # a pass put it first, or it was revoked already: either way it is right
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "a new gateway key is not on the bus yet; the sync will put it",
                exc,
                {"key_id": key.key_id},
            )
            self._wanted.set()

    async def revoked(self, key_id: str) -> None:
        """Delete a key whose revocation has just committed; the gateway refuses it from then
        on. Raises Unavailable when the bus does not take the delete (the sync retries it)."""
        try:
            self._require_bus()
            await self._kv.delete(names.gateway_key_key(key_id))
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "a revoked gateway key could not be removed from the bus; the sync will",
                exc,
                {"key_id": key_id},
            )
            self._wanted.set()
            raise Unavailable(
                "the key is revoked, but the gateway could not be told now (the bus did not "
                "answer); the gateway refuses it as soon as the api reaches the bus again"
            ) from None

    def _require_bus(self) -> None:
        # A client that is not connected would hold a publish until its ack timed out.
        if not self._nc.is_connected:
            raise BusUnavailable("not connected to NATS")

    def _reconnects(self) -> int:
        return int(self._nc.stats.get("reconnects", 0))

    async def _run(self) -> None:
        failing = False
        seen_reconnects = self._reconnects()
        due = 0.0
        while not self._stopping.is_set():
            reconnects = self._reconnects()
            if self._wanted.is_set():
                self._wanted.clear()
                if not failing:  # while failing, the retry is due within RETRY_S already
                    due = 0.0
            if time.monotonic() >= due or reconnects != seen_reconnects:
                seen_reconnects = reconnects
                try:
                    await self.run_once()
                except Exception as exc:
                    if outlives(exc, nats.errors.Error, SQLAlchemyError):
                        # The bus or the store away (or refusing: said with its traceback).
                        if not failing:
                            log_failure(log, "gateway keys sync failed; will retry", exc)
                        failing = True
                        due = time.monotonic() + min(self._period_s, RETRY_S)
                    else:
                        # A bug must not end the repairs for good: the next pass may get past it.
                        log.exception("gateway keys sync failed unexpectedly")
                        due = time.monotonic() + self._period_s
                else:
                    if failing:
                        log.info("gateway keys sync passes again")
                    failing = False
                    due = time.monotonic() + self._period_s
                    if self._next_expiry is not None:
                        # The next expiry leaves the bucket at once, not up to a period late.
                        expires_in = (self._next_expiry - self._clock()).total_seconds()
                        due = min(due, time.monotonic() + max(expires_in, 0.0) + 0.01)
            wait = max(min(due - time.monotonic(), RECONNECT_POLL_S), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken(), wait)

    async def _woken(self) -> None:
        """Return when the sync stops or a route asks for a pass."""
        stopping = asyncio.ensure_future(self._stopping.wait())
        wanted = asyncio.ensure_future(self._wanted.wait())
        try:
            await asyncio.wait((stopping, wanted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            wanted.cancel()

    async def run_once(self) -> SyncReport:
        """One pass: the bucket made to hold exactly the live keys. Raises when the store or
        NATS fails (the next pass tries again)."""
        self._require_bus()
        # The bucket before the store: see the module's docstring.
        entries = await self._read_bucket()
        now = self._clock()
        live = await live_keys(self._store, now)
        wanted = {names.gateway_key_key(key_id): key for key_id, key in live.items()}
        put: list[str] = []
        deleted: list[str] = []
        for bucket_key, key in wanted.items():
            entry = entries.get(bucket_key)
            if entry is not None and _holds(entry, key):
                continue
            revision = 0 if entry is None else entry.revision
            if await _written(self._kv.update(bucket_key, key.to_bytes(), last=revision)):
                put.append(key.key_id)
        for bucket_key, entry in sorted(entries.items()):
            if entry.value is None or bucket_key in wanted:
                continue
            if await _written(self._kv.delete(bucket_key, last=entry.revision)):
                deleted.append(bucket_key)
        expiries = [k.expires_at for k in live.values() if k.expires_at is not None]
        self._next_expiry = min(expiries, default=None)
        self.passes += 1
        report = SyncReport(tuple(put), tuple(deleted))
        if put or deleted:
            self.reports.append(report)
            expired = sum(1 for k in deleted if _expired(entries[k], now))
            # Expiries are the bucket's ordinary course; anything else is a repair.
            log.log(
                logging.INFO if expired == len(deleted) and not put else logging.WARNING,
                "gateway keys put right on the bus",
                extra={"put": len(put), "deleted": len(deleted), "expired": expired},
            )
        return report

    async def _read_bucket(self) -> dict[str, KeyState]:
        """Every key of the bucket with its revision and value (None: deleted)."""
        return await read_bucket(self._kv, ">", timeout_s=READ_TIMEOUT_S)


async def _written(write: Awaitable[object]) -> bool:
    """Await a conditional write; False when the key changed since it was read."""
    try:
        await write
    except KeyWrongLastSequenceError:
        return False
    except APIError as exc:
        if exc.err_code in _WRONG_LAST_SEQUENCE:  # a delete's refusal is not translated
            return False
        raise
    return True


def _expired(entry: KeyState, now: datetime) -> bool:
    """Whether a bucket entry is a key that has expired by `now`."""
    try:
        key = GatewayKey.from_bytes(entry.value or b"")
    except ValidationError:
        return False
    return key.expires_at is not None and key.expires_at <= now


def _holds(entry: KeyState, key: GatewayKey) -> bool:
    """Whether a bucket entry is this key as the gateway should read it."""
    if entry.value is None:
        return False
    try:
        return GatewayKey.from_bytes(entry.value) == key
    except ValidationError:
        return False
