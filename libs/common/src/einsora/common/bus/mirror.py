"""KvMirror: an in-memory copy of a KV bucket that stays right across restarts and drift.

Services that serve from a bucket (the proxy's route table, the api's machines view, and later
the gateway) keep its latest values in memory. A bare nats-py watch is not enough for that: its
ordered consumer does not survive a server restart with an empty store, a watch made before a
reconnect is not re-created, and a key purged from the stream leaves no trace a watch sees. The
mirror therefore re-reads the bucket with a fresh watch after every reconnect (and, if asked, on
a period), and reports each key that vanished meanwhile as deleted, so a deletion (which ends
sessions in the proxy) is never lost.

It reads only through a watch (a consumer on the bucket's stream, with flow control) and binds
the bucket without a stream-info call, so it works under the narrow bus identities of ADR-0009.
Callbacks are plain functions run on the event loop; one that raises is logged and the mirror
goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from einsora.common.bus.kv import bind_bucket, check_whole, key_count
from einsora.common.bus.names import BucketName
from einsora.common.bus.reconnects import reconnects
from einsora.common.failures import log_failure, outlived
from einsora.common.runloop import raise_if_cancelled

log = logging.getLogger("einsora.bus.mirror")

OnPut = Callable[[str, bytes], None]
OnDelete = Callable[[str], None]
OnSynced = Callable[[], None]


class KvMirror:
    """Delivers every key of `bucket` (matching `keys`) to `on_put`/`on_delete`, for ever.

    `start()` returns once the bucket's current values are delivered. After that, each change
    is delivered as it happens; after a reconnect, a failed watch, or every `audit_s` seconds,
    the bucket is read again and whatever changed unseen is delivered (a key gone is a
    deletion). `ensure`, if given, runs before each read (e.g. provisioning a bucket that a
    restarted server no longer has).
    """

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        bucket: BucketName,
        *,
        on_put: OnPut,
        on_delete: OnDelete,
        on_synced: OnSynced | None = None,
        keys: Sequence[str] = (">",),
        audit_s: float | None = None,
        retry_s: float = 1.0,
        ensure: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._nc = nc
        self._js = js
        self._kv = bind_bucket(js, bucket)
        self._bucket = bucket
        self._on_put = on_put
        self._on_delete = on_delete
        self._on_synced = on_synced
        self._filters = tuple(keys)
        self._audit_s = audit_s
        self._retry_s = retry_s
        self._ensure = ensure
        self._revisions: dict[str, int] = {}
        self._watchers: list[KeyValue.KeyWatcher] = []
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    def keys(self) -> set[str]:
        """The keys the mirror holds a value for now."""
        return set(self._revisions)

    async def start(self, *, sync_timeout_s: float | None = 10.0) -> None:
        """Start mirroring; returns once the current values are in (raises TimeoutError after
        `sync_timeout_s`; the mirror keeps trying)."""
        self._task = asyncio.create_task(self._run(), name=f"{self._bucket.name} mirror")
        await asyncio.wait_for(self._synced.wait(), sync_timeout_s)

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._unwatch()

    async def _run(self) -> None:
        full = True  # every read but an audit's delivers every value
        while True:
            raise_if_cancelled()
            signal = reconnects(self._nc)
            seen = signal.count
            try:
                watchers = await self._resync(full=full)
                # Only an audit on the same connection may trust revisions: after a reconnect
                # or a broken watch the server may be a new one whose revisions restarted.
                audit = await self._follow(watchers, seen)
                full = not audit or signal.count != seen
            except Exception as exc:
                raise_if_cancelled()
                # A mirror that stopped would serve stale values (and never revoke): go on,
                # whatever it was. Before its first read, a bucket not made yet is the api
                # still starting (its service makes the buckets): no warning a person should read.
                where = {"bucket": self._bucket.name}
                if isinstance(exc, NotFoundError) and not self._synced.is_set():
                    log.info("kv mirror read failed; retrying", extra={**where, "error": repr(exc)})
                else:
                    log_failure(log, "kv mirror read failed; retrying", exc, where)
                full = True
                await asyncio.sleep(self._retry_s)

    async def _resync(self, *, full: bool) -> list[KeyValue.KeyWatcher]:
        """Replace the watch with a fresh one and deliver what differs from what we hold."""
        await self._unwatch()
        if self._ensure is not None:
            await self._ensure()
        seen: dict[str, int] = {}
        puts: list[tuple[str, bytes, int]] = []
        for pattern in self._filters:
            expected = await key_count(self._js, self._bucket, pattern)
            watcher = await self._kv.watch(pattern)
            self._watchers.append(watcher)
            delivered = 0
            while True:
                entry = await watcher.updates(timeout=30)  # type: ignore[no-untyped-call]
                if entry is None:  # nats-py's "initial values done" marker
                    break
                delivered += 1
                if entry.operation in (KV_DEL, KV_PURGE):
                    continue
                seen[entry.key] = entry.revision or 0
                puts.append((entry.key, entry.value or b"", entry.revision or 0))
            # A short read would delete what it missed from the mirror: read again instead.
            check_whole(self._bucket, delivered, expected)
        # What changed while no watch was looking: keys gone, and (when revisions can be
        # trusted, i.e. the same server's store) values the watch did not deliver.
        repaired = 0
        for key in sorted(set(self._revisions) - set(seen)):
            repaired += 1
            self._delete(key)
        for key, value, revision in puts:
            if full or self._revisions.get(key) != revision:
                repaired += 0 if full else 1
                self._put(key, value, revision)
        if repaired:
            log.warning(
                "kv mirror repaired changes its watch missed",
                extra={"bucket": self._bucket.name, "keys": repaired},
            )
        self._synced.set()
        if self._on_synced is not None:
            self._call(self._on_synced)
        return list(self._watchers)

    async def _follow(self, watchers: list[KeyValue.KeyWatcher], seen: int) -> bool:
        """Deliver changes until a reconnect, a failed watch, or the next audit (True)."""
        pumps = [asyncio.create_task(self._pump(w)) for w in watchers]
        reconnected = asyncio.ensure_future(reconnects(self._nc).wait_beyond(seen))
        try:
            done, _ = await asyncio.wait(
                [*pumps, reconnected], timeout=self._audit_s, return_when=asyncio.FIRST_COMPLETED
            )
            if reconnected in done:
                log.info(
                    "reconnected to NATS; rereading bucket", extra={"bucket": self._bucket.name}
                )
                return False
            for pump in done:
                pump.result()  # a watch that failed raises here: read the bucket again
            return not done  # nothing ended: the audit is due
        finally:
            reconnected.cancel()
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(reconnected, *pumps, return_exceptions=True)

    async def _pump(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            if entry.operation in (KV_DEL, KV_PURGE):
                self._delete(entry.key)
            else:
                self._put(entry.key, entry.value or b"", entry.revision or 0)

    async def _unwatch(self) -> None:
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            with outlived(nats.errors.Error):
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _put(self, key: str, value: bytes, revision: int) -> None:
        self._revisions[key] = revision
        self._call(self._on_put, key, value)

    def _delete(self, key: str) -> None:
        self._revisions.pop(key, None)
        self._call(self._on_delete, key)

    def _call(self, callback: Callable[..., None], *args: object) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("kv mirror callback failed", extra={"bucket": self._bucket.name})
