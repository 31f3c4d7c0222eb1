"""Units of work: a whole transaction (its statements and the commit) as one call.

Through an async driver every statement is a round trip: on SQLite each is a hop to
aiosqlite's thread and back, so a BEGIN, three INSERTs and a COMMIT cost about 1 ms of CPU,
where synchronous SQLAlchemy Core does the same in 0.18 ms. A unit is a plain function of a
synchronous `sqlalchemy.Connection`, and the store runs all of it at once:

- Writes go through one `UnitWriter` per database: the units that arrive while a batch commits
  make up the next batch, committed in one transaction (group commit for every write, not only
  inserts). A batch runs first without savepoints; if one of its units raises, it is rolled
  back and run again with each unit in a savepoint of its own, so the one that raised is
  rolled back alone and hands its error to its caller alone.
- SQLite: a batch runs on one writer thread with a connection of its own (one hop per batch,
  not per statement), after taking the process's write lock for the file, so it takes turns
  with `Database.write()` blocks. Reads run on a few reader threads (WAL: readers never wait).
- Postgres: a batch runs inside one asyncpg transaction through `run_sync`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import QueuePool

T = TypeVar("T")
Unit = Callable[[sa.Connection], T]
"""Statements to run in one transaction; what it returns is handed back to the caller."""

log = logging.getLogger("einsora.store.units")

MAX_UNITS_PER_COMMIT = 512
"""At most this many units share a commit, so a flood still answers its first callers soon."""


Outcome = tuple[bool, Any]
"""(True, what the unit returned) or (False, what it raised)."""
BatchRunner = Callable[[list[Unit[Any]]], Awaitable[list[Outcome]]]


@dataclass
class _Waiting(Generic[T]):
    unit: Unit[T]
    future: asyncio.Future[T]


class RunApart(Exception):
    """A unit of a batch run together raised: the transaction is rolled back, and the batch
    runs again with each unit in a savepoint of its own (`run_units`)."""


def run_together(conn: sa.Connection, units: list[Unit[Any]]) -> list[Outcome]:
    """Inside an open transaction: the units one after another, without savepoints, which
    cost about as much as a launch's own statements. Almost every batch commits whole; when a
    unit raises, this raises `RunApart` (the caller rolls back and calls `run_units`). A lone
    unit's error propagates as it is."""
    if len(units) == 1:
        return [(True, units[0](conn))]
    outcomes: list[Outcome] = []
    for unit in units:
        try:
            outcomes.append((True, unit(conn)))
        except Exception as exc:
            raise RunApart from exc
    return outcomes


def run_units(conn: sa.Connection, units: list[Unit[Any]]) -> list[Outcome]:
    """Inside an open transaction: each unit in a savepoint of its own, so one that raises is
    rolled back alone. A lone unit needs no savepoint: what it raises propagates, and the caller
    rolls the whole transaction back."""
    if len(units) == 1:
        return [(True, units[0](conn))]
    outcomes: list[Outcome] = []
    for unit in units:
        # Plain SQL savepoints: SQLAlchemy's nested transactions cost more Python per unit
        # than the unit's own statements, and nothing here needs their bookkeeping.
        conn.exec_driver_sql("SAVEPOINT einsora_unit")
        try:
            value = unit(conn)
        except Exception as exc:
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT einsora_unit")
            conn.exec_driver_sql("RELEASE SAVEPOINT einsora_unit")
            outcomes.append((False, exc))
        else:
            conn.exec_driver_sql("RELEASE SAVEPOINT einsora_unit")
            outcomes.append((True, value))
    return outcomes


class UnitWriter:
    """Runs write units one batch at a time: the units that arrive while a batch commits make
    up the next one (group commit). `commit` runs a batch in one transaction."""

    def __init__(self, commit: BatchRunner) -> None:
        self._commit = commit
        self._queue: list[_Waiting[Any]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.commits = 0
        """Transactions committed (for tests and benchmarks: fewer than units means merged)."""

    async def run(self, unit: Unit[T]) -> T:
        if self._closed:
            raise RuntimeError("the store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.append(_Waiting(unit, future))
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._serve(), name="unit writer")
        assert self._wake is not None
        self._wake.set()
        return await future

    async def close(self) -> None:
        """Commit what is queued, then stop taking units."""
        self._closed = True
        task, self._task = self._task, None
        if task is None or task.done():
            return
        assert self._wake is not None
        self._wake.set()
        try:
            await asyncio.wait_for(task, 30)
        except TimeoutError:
            log.warning("the unit writer did not finish in time")

    async def _serve(self) -> None:
        assert self._wake is not None
        while True:
            while self._queue:
                batch = [w for w in self._queue[:MAX_UNITS_PER_COMMIT] if not w.future.done()]
                del self._queue[:MAX_UNITS_PER_COMMIT]
                if batch:
                    await self._settle(batch)
            if self._closed:
                return
            await self._wake.wait()
            self._wake.clear()

    async def _settle(self, batch: list[_Waiting[Any]]) -> None:
        try:
            outcomes = await self._commit([w.unit for w in batch])
        except BaseException as exc:
            # The transaction failed as a whole (a lone unit raised, the commit failed, or this
            # task was cancelled): nothing of the batch is stored, and every caller learns it.
            error = exc if isinstance(exc, Exception) else RuntimeError("the store stopped")
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        self.commits += 1
        for waiting, (ok, value) in zip(batch, outcomes, strict=True):
            if waiting.future.done():
                continue
            if ok:
                waiting.future.set_result(value)
            else:
                waiting.future.set_exception(value)


def sync_sqlite_engine(
    url: str, *, pool_size: int, on_connect: Callable[[Any, Any], None]
) -> sa.Engine:
    """A synchronous pysqlite engine over the file of an async `sqlite+aiosqlite` URL; its
    connections are used from the store's own threads only, one thread at a time each."""
    sync_url = make_url(url).set(drivername="sqlite")
    engine = sa.create_engine(
        sync_url,
        poolclass=QueuePool,
        pool_size=pool_size,
        max_overflow=0,
        pool_reset_on_return=None,
        connect_args={"check_same_thread": False},
    )
    sa.event.listen(engine, "connect", on_connect)
    return engine


class SqliteWriterThread:
    """The one thread, with one connection, that commits a SQLite file's unit batches; each
    batch first takes the process's write lock for the file (`lock()`), so it takes turns with
    `Database.write()` blocks."""

    def __init__(
        self, engine: sa.Engine, lock: Callable[[], asyncio.Lock], *, options: dict[str, Any]
    ) -> None:
        self._engine = engine
        self._lock = lock
        self._options = options
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="einsora-sqlite-writer")
        self._conn: sa.Connection | None = None

    async def commit(self, units: list[Unit[Any]]) -> list[Outcome]:
        async with self._lock():
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._thread, self._commit, units)

    def _commit(self, units: list[Unit[Any]]) -> list[Outcome]:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self._engine.connect().execution_options(**self._options)
        try:
            with self._conn.begin():
                return run_together(self._conn, units)
        except RunApart:
            pass
        with self._conn.begin():
            return run_units(self._conn, units)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._disconnect)
        self._thread.shutdown(wait=True)

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()


class SqliteReaders:
    """Runs read units on a few threads, each on a pooled connection (no transaction: each
    statement reads its own consistent snapshot, as `Database.read()` does)."""

    def __init__(self, engine: sa.Engine, *, threads: int, read_options: dict[str, Any]) -> None:
        self._engine = engine.execution_options(**read_options)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="einsora-sqlite-reader")

    async def run(self, unit: Unit[T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self._read, unit)

    def _read(self, unit: Unit[T]) -> T:
        with self._engine.connect() as conn:
            return unit(conn)

    async def close(self) -> None:
        self._threads.shutdown(wait=True)
