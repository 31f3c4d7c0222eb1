"""One table's rows kept on keys of a KV bucket, written with conditional writes (ADR-0011).

Routes write a row's key once its unit of work commits, before they answer. A crash between the
commit and the bus, a bus that was down or came back empty, or a row that changed by time alone
(a key that expired) leaves the bucket wrong. So a **repair** pass (`repair()`, run by a
`RepairLoop`) puts every row where the bucket lacks it or holds something else, and deletes
every key of the projection that is no row's.

Every write a pass makes is conditional on the revision it read
(`Nats-Expected-Last-Subject-Sequence`), and a pass reads the bucket before the store. A route
that writes after a newer commit therefore always wins:

- either its write changed the revision, and the pass's older write is refused;
- or it came before the pass read the bucket, and the store the pass read afterwards holds
  the newer row too.

A refused write is left to the next pass, which sees both.

`put_from_store` gives a route the same guarantee when two of its own requests race. It reads
the key's revision, then the store, and writes on that revision, reading again when another
write overtook it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, NamedTuple, TypeVar

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from einsora.common.bus import KeyState, bind_bucket, read_bucket
from einsora.common.bus.names import BucketName
from einsora.common.errors import BusUnavailable
from einsora.common.repair import RepairLoop
from einsora.common.schemas import Message

log = logging.getLogger("einsora.api.projections")

READ_TIMEOUT_S = 10.0
"""The longest wait for the next entry while reading the bucket."""

WRITE_ATTEMPTS = 3
"""How often `put_from_store` reads again after another write overtook it, before leaving the
key to the next pass."""

_WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream's codes for a conditional write whose expected revision is not the subject's."""

FAILURES: tuple[type[BaseException], ...] = (nats.errors.Error, SQLAlchemyError)
"""What a projection outlives besides transient failures: the bus or the store refusing."""

R = TypeVar("R", bound=Message)


class SyncReport(NamedTuple):
    """What one pass changed: the rows it put (by id) and the bucket keys it deleted."""

    put: tuple[str, ...]
    deleted: tuple[str, ...]


class KvProjection(Generic[R]):
    """Rows of type `record`, by id, on the bucket's keys `key_of(id)` matching `keys`.

    `rows()` reads every row from the store. `stays(have, want)` may keep a bucket value that
    differs from the store: a revocation that committed after the pass read the store, say.
    """

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        bucket: BucketName,
        *,
        what: str,
        record: type[R],
        key_of: Callable[[str], str],
        rows: Callable[[], Awaitable[dict[str, R]]],
        period_s: float,
        keys: str = ">",
        stays: Callable[[R, R], bool] | None = None,
        due: Callable[[], float | None] | None = None,
        quiet: Callable[[SyncReport, dict[str, KeyState]], bool] | None = None,
    ) -> None:
        self.kv = bind_bucket(js, bucket)
        self._nc = nc
        self._what = what
        self._record = record
        self._key_of = key_of
        self._rows = rows
        self._keys = keys
        self._stays = stays
        self._quiet = quiet
        self.loop = RepairLoop(
            nc, self.repair, what=what, period_s=period_s, failures=FAILURES, due=due
        )
        self.reports: list[SyncReport] = []
        """Each pass that changed something (for tests and operators' logs)."""

    @property
    def passes(self) -> int:
        return self.loop.passes

    async def start(self, *, first_now: bool = False) -> None:
        await self.loop.start(first_now=first_now)

    async def stop(self) -> None:
        await self.loop.stop()

    def wanted(self) -> None:
        """Ask for a pass soon (a route could not reach the bus, a row left the store)."""
        self.loop.wanted()

    def require_bus(self) -> None:
        # A client that is not connected would hold a publish until its ack timed out.
        if not self._nc.is_connected:
            raise BusUnavailable("not connected to NATS")

    async def repair(self) -> SyncReport:
        """One pass: the projection's keys made to hold exactly the store's rows. Raises when
        the store or NATS fails (the next pass tries again)."""
        self.require_bus()
        entries = await read_bucket(self.kv, self._keys, timeout_s=READ_TIMEOUT_S)  # first
        rows = await self._rows()
        wanted = {self._key_of(row_id): (row_id, row) for row_id, row in rows.items()}
        put: list[str] = []
        deleted: list[str] = []
        for key, (row_id, row) in sorted(wanted.items()):
            entry = entries.get(key)
            have = None if entry is None else self._parse(entry)
            if have == row or (have is not None and self._stays and self._stays(have, row)):
                continue
            revision = 0 if entry is None else entry.revision
            if await written(self.kv.update(key, row.to_bytes(), last=revision)):
                put.append(row_id)
        for key, entry in sorted(entries.items()):
            if entry.value is None or key in wanted:
                continue
            if await written(self.kv.delete(key, last=entry.revision)):
                deleted.append(key)
        report = SyncReport(tuple(put), tuple(deleted))
        if put or deleted:
            self.reports.append(report)
            level = (
                logging.INFO if self._quiet and self._quiet(report, entries) else logging.WARNING
            )
            log.log(
                level,
                f"{self._what}: the bucket put right from the store",
                extra={"put": len(put), "deleted": len(deleted)},
            )
        return report

    async def put(self, row_id: str, row: R, *, only_new: bool = False) -> bool:
        """Write one row now; `only_new`: only if its key was never written (a removal that
        overtook it wins). False when another write came first."""
        key = self._key_of(row_id)
        if only_new:
            return await written(self.kv.update(key, row.to_bytes(), last=0))
        await self.kv.put(key, row.to_bytes())
        return True

    async def delete(self, row_id: str) -> None:
        await self.kv.delete(self._key_of(row_id))

    async def put_from_store(self, row_id: str, row: Callable[[], Awaitable[R | None]]) -> bool:
        """Make one key what the store holds now (None: no row, so no key), safe against a
        concurrent write of the same key. False when others overtook it every time (the next
        pass, asked for, puts the newest)."""
        key = self._key_of(row_id)
        for _ in range(WRITE_ATTEMPTS):
            try:
                current = await self.kv.get(key)
                entry = KeyState(current.revision or 0, current.value or b"")
            except KeyNotFoundError as exc:  # never written (0), or a delete marker's revision
                revision = exc.entry.revision if exc.entry is not None else 0
                entry = KeyState(revision or 0, None)
            want = await row()  # the bucket before the store: see the module
            if want is None:
                if entry.value is None or await written(self.kv.delete(key, last=entry.revision)):
                    return True
                continue
            if self._parse(entry) == want or await written(
                self.kv.update(key, want.to_bytes(), last=entry.revision)
            ):
                return True
        self.wanted()
        return False

    def _parse(self, entry: KeyState) -> R | None:
        if entry.value is None:
            return None
        try:
            return self._record.from_bytes(entry.value)
        except ValidationError:
            return None  # unreadable: put right as if missing


class ProjectionSync:
    """What a projection shows the rest of the api: started and stopped with it, asked for a
    pass, and counted (`passes`, `reports`: for tests and operators' logs)."""

    def __init__(self, projection: KvProjection[Any], *, first_now: bool = False) -> None:
        self.projection = projection
        self._first_now = first_now

    @property
    def passes(self) -> int:
        return self.projection.passes

    @property
    def reports(self) -> list[SyncReport]:
        return self.projection.reports

    async def start(self) -> None:
        """The first pass (now, or in the background), then as `RepairLoop` says."""
        await self.projection.start(first_now=self._first_now)

    async def stop(self) -> None:
        await self.projection.stop()

    def wanted(self) -> None:
        """Ask for a pass soon."""
        self.projection.wanted()

    async def repair(self) -> SyncReport:
        """One pass now (kv.py)."""
        return await self.projection.repair()

    run_once = repair


async def written(write: Awaitable[object]) -> bool:
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
