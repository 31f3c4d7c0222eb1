"""Publishing each tenant's usage to KV `usage/tenant.<id>`, for the scheduler's fair share
and quotas.

The KV value is a projection of the store, rewritten rather than patched: a tenant whose usage
changed is published shortly after (changes within `debounce_s` go out together), and every
tenant with recent use is published every `period_s` whatever happened, so an open allocation's
growing figures, a decay and a lost write all catch up. A failed write is retried with the next
round; nothing here is the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from datetime import datetime

from nats.js.kv import KeyValue

from einsora.accounting.store import AccountingStore
from einsora.common.bus import names
from einsora.common.runloop import raise_if_cancelled

log = logging.getLogger("einsora.accounting.publisher")

DEBOUNCE_S = 1.0
PERIOD_S = 30.0
RETRY_S = 1.0


class UsagePublisher:
    """Writes tenants' `TenantUsage` to KV: soon after a change, and every `period_s`."""

    def __init__(
        self,
        store: AccountingStore,
        kv: KeyValue,
        *,
        half_life_h: float,
        clock: Callable[[], datetime],
        debounce_s: float = DEBOUNCE_S,
        period_s: float = PERIOD_S,
    ) -> None:
        self._store = store
        self._kv = kv
        self._half_life_h = half_life_h
        self._clock = clock
        self._debounce_s = debounce_s
        self._period_s = period_s
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        """Values written since start (for tests and diagnostics)."""

    def changed(self, tenant_ids: Iterable[str]) -> None:
        """These tenants' usage changed: publish them soon."""
        before = len(self._dirty)
        self._dirty.update(tenant_ids)
        if len(self._dirty) != before:
            self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="accounting usage publisher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_full = loop.time()  # every recent tenant once at start
        while True:
            raise_if_cancelled()
            wait = next_full - loop.time()
            if wait > 0 and not self._dirty:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()
            full = loop.time() >= next_full
            if not full:
                # Let the changes of the next second or so go out together.
                await asyncio.sleep(self._debounce_s)
                full = loop.time() >= next_full
            tenants, self._dirty = self._dirty, set()
            try:
                await self.publish(None if full else tenants, also=tenants)
            except Exception as exc:
                # The store or the bus is away: try again next round, with the same tenants.
                self._dirty |= tenants
                log.warning("usage not published; retrying: %r", exc, extra={"error": repr(exc)})
                await asyncio.sleep(RETRY_S)
                continue
            if full:
                next_full = loop.time() + self._period_s

    async def publish(self, tenant_ids: Iterable[str] | None, *, also: Iterable[str] = ()) -> int:
        """Write these tenants' usage now (None: every tenant with recent use, and `also`);
        how many values were written."""
        now = self._clock()
        wanted = None if tenant_ids is None else sorted(set(tenant_ids))
        usages = await self._store.tenant_usage(wanted, now, self._half_life_h)
        extra = sorted(set(also) - {u.tenant_id for u in usages})
        if wanted is None and extra:
            usages += await self._store.tenant_usage(extra, now, self._half_life_h)
        futures = []
        for usage in usages:
            key = names.tenant_usage_key(usage.tenant_id)
            futures.append(self._kv.put(key, usage.to_bytes()))
        results = await asyncio.gather(*futures, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        self.published += len(results) - len(errors)
        if errors:
            raise errors[0]
        return len(usages)
