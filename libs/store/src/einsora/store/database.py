"""One database behind an async engine, with one policy for transactions on every service.

On SQLite (Solo, where the api and the scheduler share one file), write transactions begin with
`BEGIN IMMEDIATE` and run one at a time in the process, whichever service's they are: a deferred
transaction that reads and then writes fails at once (SQLITE_BUSY_SNAPSHOT, which no busy
timeout retries) when another writer committed in between. Reads run without a transaction, one
consistent statement each. On Postgres, a write is an ordinary transaction.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.store.engine import create_engine, is_sqlite
from einsora.store.migrations import upgrade

_WRITE = "einsora_write"
_READ = "einsora_read"

# One lock per SQLite file and event loop: every service of this process writing that file
# waits its turn here rather than in SQLite's busy loop.
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _file_lock(url: str) -> asyncio.Lock:
    database = make_url(url).database or ""
    key = str(Path(database).resolve()) if database not in ("", ":memory:") else url
    by_file = _locks.setdefault(asyncio.get_running_loop(), {})
    return by_file.setdefault(key, asyncio.Lock())


class Database:
    """A service's database: `write()` is a transaction, `read()` a plain connection."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        self.url = url
        self.sqlite = is_sqlite(url)
        if self.sqlite:
            # No transaction is ever left open on a returned connection (reads run without one,
            # writes commit or roll back), so resetting each connection is a wasted round trip.
            engine_options.setdefault("pool_reset_on_return", None)
        self.engine = create_engine(url, **engine_options)
        self._reader = self.engine.execution_options(**{_READ: True})
        if self.sqlite:
            _explicit_sqlite_transactions(self.engine.sync_engine)

    async def migrate(self, migrations: Path, *, version_table: str) -> None:
        """Bring the tables to the latest migration (a second run changes nothing)."""
        await upgrade(self.engine, migrations, version_table=version_table)

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
        async with _file_lock(self.url), self.engine.connect() as conn:
            await conn.execution_options(**{_WRITE: True})
            async with conn.begin():
                yield conn

    async def ping(self) -> None:
        async with self.read() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def close(self) -> None:
        await self.engine.dispose()


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
