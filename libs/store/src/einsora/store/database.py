"""One database behind an async engine, with one policy for transactions on every service.

On SQLite (Solo, where the api and the scheduler share one file), write transactions begin with
`BEGIN IMMEDIATE` and run one at a time in the process, whichever service's they are: a deferred
transaction that reads and then writes fails at once (SQLITE_BUSY_SNAPSHOT, which no busy
timeout retries) when another writer committed in between. Reads run without a transaction, one
consistent statement each. On Postgres, a write is an ordinary transaction.

`run()` and `query()` take a whole unit of work (a function of a synchronous connection) and
run it in one call (`units.py`): the hot paths use them; `write()` and `read()` remain for the
rest, under the same lock.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.store.engine import create_engine, is_sqlite, on_sqlite_connect
from einsora.store.migrations import upgrade
from einsora.store.units import (
    Outcome,
    RunApart,
    SqliteReaders,
    SqliteWriterThread,
    Unit,
    UnitWriter,
    run_together,
    run_units,
    sync_sqlite_engine,
)

T = TypeVar("T")

_WRITE = "einsora_write"
_READ = "einsora_read"

# One lock per SQLite file and event loop: every service of this process writing that file
# waits its turn here rather than in SQLite's busy loop.
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _lock_key(url: str) -> str:
    """Which file a SQLite URL writes (one lock per file, whatever spelling reaches it)."""
    database = make_url(url).database or ""
    return str(Path(database).resolve()) if database not in ("", ":memory:") else url


def _file_lock(key: str) -> asyncio.Lock:
    by_file = _locks.setdefault(asyncio.get_running_loop(), {})
    lock = by_file.get(key)
    if lock is None:
        lock = by_file[key] = asyncio.Lock()
    return lock


class Database:
    """A service's database: `write()` is a transaction, `read()` a plain connection."""

    def __init__(self, url: str, *, reader_threads: int = 4, **engine_options: Any) -> None:
        self.url = url
        self.sqlite = is_sqlite(url)
        self._lock_key = _lock_key(url) if self.sqlite else url
        if self.sqlite:
            # No transaction is ever left open on a returned connection (reads run without one,
            # writes commit or roll back), so resetting each connection is a wasted round trip.
            engine_options.setdefault("pool_reset_on_return", None)
        self.engine = create_engine(url, **engine_options)
        self._reader = self.engine.execution_options(**{_READ: True})
        self._thread: SqliteWriterThread | None = None
        self._readers: SqliteReaders | None = None
        self._writer = UnitWriter(self._commit_units)
        if self.sqlite:
            _explicit_sqlite_transactions(self.engine.sync_engine)
            if (make_url(url).database or ":memory:") != ":memory:":
                self._thread, self._readers = _sqlite_units(url, reader_threads)

    async def migrate(self, migrations: Path, *, version_table: str) -> None:
        """Bring the tables to the latest migration (a second run changes nothing)."""
        # On SQLite the migration's transaction begins IMMEDIATE, as every write does: a plain
        # BEGIN reads first and then asks to write, and two processes migrating one file at
        # once (two schedulers of a cell, a standby beside its leader) then fail with
        # "database is locked" at once instead of waiting their turn (busy_timeout).
        engine = self.engine.execution_options(**{_WRITE: True}) if self.sqlite else self.engine
        await upgrade(engine, migrations, version_table=version_table)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self._reader.connect() as conn:
            yield conn

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """One transaction, committed when the block ends without an exception."""
        if not self.sqlite:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with _file_lock(self._lock_key), self.engine.connect() as conn:
            await conn.execution_options(**{_WRITE: True})
            async with conn.begin():
                yield conn

    async def run(self, unit: Unit[T]) -> T:
        """Run `unit` as one write transaction, in one call; what it returns, or what it raised
        (then nothing it did is kept). It may share a commit with concurrent units, each in a
        savepoint of its own."""
        return await self._writer.run(unit)

    async def _commit_units(self, units: list[Unit[Any]]) -> list[Outcome]:
        if self._thread is not None:
            return await self._thread.commit(units)
        try:
            async with self.write() as conn:
                return await conn.run_sync(run_together, units)
        except RunApart:
            pass
        async with self.write() as conn:
            return await conn.run_sync(run_units, units)

    async def query(self, unit: Unit[T]) -> T:
        """Run `unit`'s reads in one call, without a transaction on SQLite (each statement its
        own snapshot, as `read()`)."""
        if self._readers is not None:
            return await self._readers.run(unit)
        async with self.read() as conn:
            return await conn.run_sync(unit)

    @property
    def commits(self) -> int:
        """Transactions `run()` committed (concurrent units share them, so often fewer)."""
        return self._writer.commits

    async def ping(self) -> None:
        async with self.read() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def close(self) -> None:
        await self._writer.close()
        if self._thread is not None:
            await self._thread.close()
        if self._readers is not None:
            await self._readers.close()
        await self.engine.dispose()


def _sqlite_units(url: str, reader_threads: int) -> tuple[SqliteWriterThread, SqliteReaders]:
    """The unit writer and readers of a SQLite file: synchronous connections on threads of
    their own, with the same PRAGMAs and transaction policy as the async engine's."""

    key = _lock_key(url)

    def lock() -> asyncio.Lock:
        return _file_lock(key)

    writes = sync_sqlite_engine(url, pool_size=1, on_connect=on_sqlite_connect)
    _explicit_sqlite_transactions(writes)
    reads = sync_sqlite_engine(url, pool_size=reader_threads, on_connect=on_sqlite_connect)
    _explicit_sqlite_transactions(reads)
    writer = SqliteWriterThread(writes, lock, options={_WRITE: True})
    readers = SqliteReaders(reads, threads=reader_threads, read_options={_READ: True})
    return writer, readers


def _explicit_sqlite_transactions(engine: sa.Engine) -> None:
    """Take transaction control from the sqlite3 module and begin writes IMMEDIATE."""

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        options = conn.get_execution_options()
        if options.get(_READ):
            return  # each statement reads its own consistent snapshot
        # Writes, and migrations (alembic through engine.begin()), in a real transaction.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get(_WRITE) else "BEGIN")
