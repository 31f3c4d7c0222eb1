"""The region's leader lease: one scheduler decides, a standby takes over when it stops (ADR-0021).

The lease lives in the `machines` bucket, beside the desired states it guards:
- `_leader.<region>.term` names the leader and its term. It changes only when the lease changes
  hands, by compare-and-set on its revision, so two standbys cannot both win.
- `_leader.<region>.heartbeat` is renewed by the leader every `lease_s / 6`. A standby that
  sees no new heartbeat for `lease_s` (on its own clock) takes the term; a leader that stops
  cleanly writes a `released` heartbeat, and a standby takes over at once.

The fence: every heartbeat, and on a single server every desired-state write, carries the
revision of the term key it took (`names.fence_headers`), so JetStream stores it only while that
term is still the latest (on a cluster each desired write is fenced on its own key instead:
projection.py). The store is fenced the same way: taking the lease raises the region's term in
the scheduler's store (`take_term`) before the book is loaded, and every cycle's commit checks
it, so a deposed leader (SIGSTOPped, partitioned, slow) commits no decision. A refused heartbeat
tells the leader it was deposed; one refused because the term key is gone (a wiped bucket) makes
it take a new term at once.

The fence fails closed (issue 35, F1): a deposed leader keeps the term it held, so the store
refuses whatever it still tries to commit, and the service stops its engine and its KV audit
before anything else. Nothing here sets the store's fence back to "no check".

Every read and write here survives the bus's transient failures (einsora.common.transient): a
standby whose attempt meets a restarting server or a missing bucket tries again at its next
poll, never ends (F2).

A scheduler restarted with the same data directory is the same holder and takes its lease back
without waiting for it to lapse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from pydantic import ValidationError

from einsora.common.bus import bind_bucket, names
from einsora.common.files import write_private
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import LeaderLease
from einsora.common.transient import is_transient
from einsora.scheduler.store import SchedulerStore

log = logging.getLogger("einsora.scheduler.lease")

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a write whose expected last sequence did not match."""


def holder_id(data_dir: Path, region: str) -> str:
    """This scheduler's name in the lease: kept in the data dir, so a restart is the same
    holder (and takes its lease back at once)."""
    path = data_dir / "scheduler" / f"holder-{region}"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        holder = f"scheduler-{secrets.token_hex(6)}"
        write_private(path, holder + "\n")
        return holder


class RegionLease:
    """Acquire, keep and release one region's leader lease."""

    def __init__(
        self,
        js: JetStreamContext,
        store: SchedulerStore,
        *,
        region: str,
        holder: str,
        lease_s: float = 3.0,
    ) -> None:
        self._js = js
        self._kv = bind_bucket(js, names.MACHINES)
        self._store = store
        self.region = region
        self.holder = holder
        self.lease_s = lease_s
        self.renew_s = lease_s / 6
        self.poll_s = min(0.1, lease_s / 20)
        """How often a standby looks at the heartbeat."""
        self._term_key = names.leader_term_key(region)
        self._heartbeat_key = names.leader_heartbeat_key(region)
        self.term = 0
        """The term this scheduler holds (0: none)."""
        self.revision = 0
        """The term key's revision this scheduler's writes are fenced on."""
        self._renewing: asyncio.Task[None] | None = None
        self.deposed = False
        """Another scheduler took the lease from this one while it held it."""
        self.on_fence: Callable[[dict[str, str]], None] | None = None
        """Told the new fence when the lease is taken (again, after a wiped bucket)."""
        self.previous_beat_at: datetime | None = None
        """When the bus stored the region's last heartbeat before this scheduler took the lease
        (the bus's clock; None: there was none): how long the region went without a leader,
        which tells the engine how to time its machines' silence (issue 35, F7)."""
        self._failing = False

    @property
    def fence(self) -> dict[str, str]:
        return names.fence_headers(self.region, self.revision)

    @property
    def held(self) -> bool:
        return self.term > 0

    # --- taking it --------------------------------------------------------------------------

    async def try_acquire(self) -> bool:
        """Take the lease if it is free, released, lapsed or ours already; False if another
        scheduler holds it (it stays theirs), or the bus could not say just now. Never waits for
        a lease to lapse."""
        try:
            current, revision = await self._read(self._term_key)
            if current is None:
                return await self._take(1, 0)
            if self._ours(current):
                return await self._take(current.term + 1, revision)
            beat, _ = await self._read(self._heartbeat_key)
        except Exception as exc:
            self._transient(exc, "the lease could not be read")
            return False
        if beat is not None and beat.released and beat.term == current.term:
            return await self._take(current.term + 1, revision)
        return False

    def _ours(self, current: LeaderLease) -> bool:
        # Our own lease, from before a restart (or a take whose answer was lost). Not once
        # deposed: then another process runs with our data dir, and taking it back at once
        # would depose it in turn, for ever.
        return current.holder == self.holder and not self.deposed

    async def acquire(self) -> None:
        """Wait, as a standby, until this scheduler holds the lease.

        It watches the heartbeat's revision (a direct get every `poll_s`): the lease lapses
        `lease_s` after the last change it saw, on its own clock, so no two hosts' clocks are
        compared; a released heartbeat hands it over at once. A read or a take that fails for a
        transient reason is tried again at the next poll: the wait never ends but in the lease.
        """
        if await self.try_acquire():
            return
        seen: int | None = None
        since = time.monotonic()
        while True:
            raise_if_cancelled()
            await asyncio.sleep(self.poll_s)
            try:
                beat, revision = await self._read(self._heartbeat_key)
            except Exception as exc:
                self._transient(exc, "the lease's heartbeat could not be read; retrying")
                continue
            self._failing = False
            now = time.monotonic()
            if revision != seen:
                seen, since = revision, now
                if not (beat is not None and beat.released):
                    continue
            elif now - since < self.lease_s:
                continue
            try:
                current, term_revision = await self._read(self._term_key)
            except Exception as exc:
                self._transient(exc, "the lease's term could not be read; retrying")
                continue
            if current is None:
                if await self._take(1, 0):
                    return
            elif self._ours(current) or (
                beat is not None and beat.released and beat.term == current.term
            ):
                if await self._take(current.term + 1, term_revision):
                    return
            else:
                log.warning(
                    "the region's leader is silent; taking over",
                    extra={"region": self.region, "leader": current.holder, "term": current.term},
                )
                if await self._take(current.term + 1, term_revision):
                    return
            since = time.monotonic()  # another standby won (or the bus failed): wait a lease

    def _transient(self, exc: Exception, what: str) -> None:
        """Log a failure a retry may cure (once until things work again); raise any other."""
        raise_if_cancelled()
        if not is_transient(exc):
            raise exc
        if not self._failing:
            log.warning(what, extra={"region": self.region, "error": repr(exc)})
        self._failing = True

    async def _take(self, term: int, revision: int) -> bool:
        """Compare-and-set the term key from `revision` to `term` held by us, then the store's
        term: True when both are ours. False when another scheduler was first, or the bus or
        the store failed transiently (the caller tries again)."""
        value = LeaderLease(region=self.region, holder=self.holder, term=term).to_bytes()
        beat_at = await self._beat_time()
        try:
            if revision == 0:
                new_revision = await self._kv.create(self._term_key, value)
            else:
                new_revision = await self._kv.update(self._term_key, value, last=revision)
        except KeyWrongLastSequenceError as exc:
            log.info("another scheduler took the lease first", extra={"error": repr(exc)})
            return False
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE and not is_transient(exc):
                raise
            log.info("the lease was not taken; trying again", extra={"error": repr(exc)})
            return False
        except Exception as exc:
            self._transient(exc, "taking the lease failed; trying again")
            return False
        try:
            taken = await self._store.take_term(self.region, term, self.holder)
        except Exception as exc:
            self._transient(exc, "the store could not take the term; trying again")
            return False
        if not taken:
            log.warning(
                "the store has a newer term than the lease: not leading",
                extra={"region": self.region, "term": term},
            )
            return False
        self.term, self.revision = term, new_revision
        self.previous_beat_at = beat_at
        self._store.fence = (self.region, term)
        if self.on_fence is not None:
            self.on_fence(self.fence)
        self._failing = False
        try:
            await self._beat()
        except Exception as exc:  # the renewal beats again within a sixth of the lease
            self._transient(exc, "the first heartbeat failed; renewing")
        log.info(
            "leading the region", extra={"region": self.region, "term": term, "holder": self.holder}
        )
        return True

    async def _beat_time(self) -> datetime | None:
        """When the bus stored the region's last heartbeat (None: none, or unreadable now)."""
        try:
            msg = await self._js.get_msg(
                names.MACHINES.stream,
                subject=names.MACHINES.key_subject(self._heartbeat_key),
                direct=True,
            )
        except NotFoundError:
            return None
        except Exception as exc:
            self._transient(exc, "the last heartbeat's time could not be read")
            return None
        return msg.time

    async def _read(self, key: str) -> tuple[LeaderLease | None, int]:
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return None, 0
        if not entry.value:
            return None, entry.revision or 0
        try:
            return LeaderLease.from_bytes(entry.value), entry.revision or 0
        except ValidationError:
            log.warning("unreadable lease value ignored", extra={"key": key})
            return None, entry.revision or 0

    # --- keeping it -------------------------------------------------------------------------

    def keep(self, on_deposed: Callable[[], Awaitable[None]]) -> None:
        """Renew the lease until released; `on_deposed` runs once if another scheduler took it
        (it must stop the engine and the audit before anything else)."""
        self._renewing = asyncio.create_task(self._renew(on_deposed), name="scheduler lease")

    async def _renew(self, on_deposed: Callable[[], Awaitable[None]]) -> None:
        failing = False
        while True:
            raise_if_cancelled()
            await asyncio.sleep(self.renew_s)
            try:
                await self._beat()
            except APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    failing = self._renewal_failed(exc, failing)
                    continue
                try:
                    if await self._retake_wiped():
                        continue
                except Exception as retake:
                    failing = self._renewal_failed(retake, failing)
                    continue
                log.warning(
                    "deposed: another scheduler leads the region now",
                    extra={"region": self.region, "term": self.term},
                )
                # Fail closed: the store's fence keeps our old term, so a cycle that runs while
                # the service steps down commits nothing; the service stops the engine first.
                self.deposed = True
                await on_deposed()
                self.stand_down()
                return
            except Exception as exc:
                failing = self._renewal_failed(exc, failing)
                continue
            if failing:
                log.info("lease renewed again", extra={"region": self.region})
                failing = False

    def _renewal_failed(self, exc: Exception, failing: bool) -> bool:
        """A heartbeat that failed: logged (once while it keeps failing), and tried again; the
        renewal never ends but deposed or released."""
        raise_if_cancelled()
        if not failing:
            if is_transient(exc):
                log.warning("lease not renewed; retrying", extra={"error": repr(exc)})
            else:
                log.error("lease not renewed, unexpectedly; retrying", extra={"error": repr(exc)})
        return True

    def stand_down(self) -> None:
        """Another scheduler holds the lease (its heartbeat or the store said so): stop
        renewing and hold no term. The store's fence keeps the term we held: fail closed."""
        self.deposed = True
        self.term = 0
        renewing, self._renewing = self._renewing, None
        if renewing is not None and renewing is not asyncio.current_task():
            renewing.cancel()

    async def _retake_wiped(self) -> bool:
        """After a refused heartbeat: True when the lease is (again) ours. The term key gone (a
        wiped or recreated bucket) makes it take a new term at once; another holder's term, or
        another revision of ours (a second process with our data dir), means deposed."""
        current, revision = await self._read(self._term_key)
        if revision == 0:
            term = self.term + 1
            log.warning("the lease's term key is gone; taking a new term", extra={"term": term})
            return await self._take(term, 0)
        return current is not None and current.holder == self.holder and revision == self.revision

    async def _beat(self, *, released: bool = False) -> None:
        value = LeaderLease(
            region=self.region, holder=self.holder, term=self.term, released=released
        )
        await self._js.publish(
            names.MACHINES.key_subject(self._heartbeat_key),
            value.to_bytes(),
            timeout=self.lease_s,
            headers=self.fence,
        )

    async def release(self) -> None:
        """Stop renewing and say so: a standby takes over at once (best effort)."""
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewing
        if self.term:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._beat(released=True), 1.0)
        # The store's fence keeps the term we held: nothing commits on it once another takes it.
        self.term = 0
