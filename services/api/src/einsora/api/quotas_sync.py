"""The `quota.*` keys of KV `usage` hold exactly the tenant quotas of the store.

The route puts a tenant's quota once its PUT commits, before it answers. A crash between the
commit and the bus, or a bus that was down or came back empty, leaves the bucket wrong; so one
pass runs at start, every minute, after every reconnect and soon after a route could not reach
the bus: every quota is put where the bucket lacks it or holds something else, and every
`quota.*` key that is no tenant's quota is deleted. The rest of the bucket (accounting's
`tenant.*` keys) is never touched.

Every write reads the key's revision first and the store second, and is conditional on that
revision (`Nats-Expected-Last-Subject-Sequence`). Two PUTs of one tenant that race therefore
cannot leave the older on the bus: the write that read the store before the newer commit is
refused, because the newer one's write changed the revision, and it reads both again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from einsora.api.errors import Unavailable
from einsora.api.services.quotas import every_published, published
from einsora.api.store import Store
from einsora.common.bus import KeyState, bind_bucket, names, read_bucket
from einsora.common.errors import BusUnavailable
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import TenantQuota, TenantUsage

log = logging.getLogger("einsora.api.quotas")

SYNC_PERIOD_S = 60.0
"""How often a pass runs when nothing asks for one sooner."""

RECONNECT_POLL_S = 1.0
"""How often the loop looks whether the client reconnected (no I/O: a counter)."""

RETRY_S = 5.0
"""How soon a pass that failed, or that a route asked for, runs at most."""

READ_TIMEOUT_S = 10.0
"""The longest wait for the next entry while reading the bucket."""

WRITE_ATTEMPTS = 3
"""How often a route's put reads again after another write overtook it, before leaving the key
to the next pass."""

QUOTA_KEYS = "quota.*"

_WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream's codes for a conditional write whose expected revision is not the subject's."""


@dataclass(frozen=True)
class SyncReport:
    """What one pass changed: the tenants whose quota it put, the bucket keys it deleted."""

    put: tuple[str, ...]
    deleted: tuple[str, ...]


class QuotasSync:
    """Puts tenant quotas to KV for the routes, reads tenants' use, and repairs the bucket.

    `passes` counts completed passes and `reports` keeps each pass that changed something.
    """

    def __init__(
        self, store: Store, nc: NATS, js: JetStreamContext, *, period_s: float = SYNC_PERIOD_S
    ) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be positive")
        self._store = store
        self._nc = nc
        self._kv = bind_bucket(js, names.USAGE_KV)
        self._period_s = period_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._wanted = asyncio.Event()
        self.passes = 0
        self.reports: list[SyncReport] = []

    async def start(self) -> None:
        """Run a first pass now (in the background) and then as the module says."""
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="tenant quotas sync")

    async def stop(self) -> None:
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 10)
            except TimeoutError:
                log.warning("the tenant quotas sync did not stop in time")

    async def published(self, tenant_id: str) -> None:
        """Put a tenant's quota whose PUT has just committed, so the scheduler holds to it from
        the answer on. Raises Unavailable when the bus does not take it (the sync retries)."""
        try:
            self._require_bus()
            for _ in range(WRITE_ATTEMPTS):
                if await self._put_one(tenant_id):
                    return
            self._wanted.set()  # overtaken every time: the next pass puts the newest
        except Exception as exc:
            if not outlives(exc, nats.errors.Error, SQLAlchemyError):
                raise
            log_failure(
                log,
                "a tenant's quota could not be put on the bus; the sync will",
                exc,
                {"tenant_id": tenant_id},
            )
            self._wanted.set()
            raise Unavailable(
                "the quota is stored, but the scheduler could not be told now (the bus did not "
                "answer); it holds to it as soon as the api reaches the bus again"
            ) from None

    async def usage(self, tenant_id: str) -> TenantUsage | None:
        """What accounting last published of a tenant's use (None: nothing yet). Raises
        Unavailable when the bus cannot be read."""
        try:
            self._require_bus()
            entry = await self._kv.get(names.tenant_usage_key(tenant_id))
        except KeyNotFoundError:
            return None
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(log, "a tenant's use could not be read", exc)
            raise Unavailable(
                "the tenant's use could not be read from the bus now; retry shortly"
            ) from None
        try:
            return TenantUsage.from_bytes(entry.value or b"")
        except ValidationError:
            log.warning("a tenant's use on the bus is not readable", extra={"tenant_id": tenant_id})
            return None

    async def _put_one(self, tenant_id: str) -> bool:
        """Make one tenant's key what the store holds; False when another write overtook."""
        key = names.tenant_quota_key(tenant_id)
        try:
            current = await self._kv.get(key)
            entry = KeyState(current.revision or 0, current.value or b"")
        except KeyNotFoundError as exc:  # never written (0), or a delete marker's revision
            revision = exc.entry.revision if exc.entry is not None else 0
            entry = KeyState(revision or 0, None)
        quota = await published(self._store, tenant_id)  # the bucket before the store
        if quota is None:
            if entry.value is None:
                return True
            return await _written(self._kv.delete(key, last=entry.revision))
        if _holds(entry, quota):
            return True
        return await _written(self._kv.update(key, quota.to_bytes(), last=entry.revision))

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
                            log_failure(log, "tenant quotas sync failed; will retry", exc)
                        failing = True
                        due = time.monotonic() + min(self._period_s, RETRY_S)
                    else:
                        # A bug must not end the repairs for good: the next pass may get past it.
                        log.exception("tenant quotas sync failed unexpectedly")
                        due = time.monotonic() + self._period_s
                else:
                    if failing:
                        log.info("tenant quotas sync passes again")
                    failing = False
                    due = time.monotonic() + self._period_s
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
        """One pass: the `quota.*` keys made to hold exactly the store's quotas. Raises when
        the store or NATS fails (the next pass tries again)."""
        self._require_bus()
        entries = await self._read_bucket()  # the bucket before the store: see the module
        quotas = await every_published(self._store)
        wanted = {names.tenant_quota_key(tenant_id): q for tenant_id, q in quotas.items()}
        put: list[str] = []
        deleted: list[str] = []
        for bucket_key, quota in sorted(wanted.items()):
            entry = entries.get(bucket_key)
            if entry is not None and _holds(entry, quota):
                continue
            revision = 0 if entry is None else entry.revision
            if await _written(self._kv.update(bucket_key, quota.to_bytes(), last=revision)):
                put.append(quota.tenant_id)
        for bucket_key, entry in sorted(entries.items()):
            if entry.value is None or bucket_key in wanted:
                continue
            if await _written(self._kv.delete(bucket_key, last=entry.revision)):
                deleted.append(bucket_key)
        self.passes += 1
        report = SyncReport(tuple(put), tuple(deleted))
        if put or deleted:
            self.reports.append(report)
            log.warning(
                "tenant quotas put right on the bus",
                extra={"put": len(put), "deleted": len(deleted)},
            )
        return report

    async def _read_bucket(self) -> dict[str, KeyState]:
        """Every `quota.*` key with its revision and value (None: deleted)."""
        return await read_bucket(self._kv, QUOTA_KEYS, timeout_s=READ_TIMEOUT_S)


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


def _holds(entry: KeyState, quota: TenantQuota) -> bool:
    """Whether a bucket entry is this quota as the scheduler should read it."""
    if entry.value is None:
        return False
    try:
        return TenantQuota.from_bytes(entry.value) == quota
    except ValidationError:
        return False
