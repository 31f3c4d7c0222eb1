"""The api's store: one engine, its migrations, and how transactions begin.

On SQLite, write transactions begin with `BEGIN IMMEDIATE` and run one at a time in this
process: a deferred transaction that reads and then writes fails at once (SQLITE_BUSY_SNAPSHOT,
which no busy timeout retries) when another writer, the scheduler sharing Solo's file say,
committed in between. Reads run without a transaction, one consistent statement each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api.batching import InsertBatcher
from einsora.store import create_engine, is_sqlite, upgrade

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_api"
_WRITE = "einsora_write"
_READ = "einsora_read"


class Store:
    """The database the api owns; `write()` is a transaction, `read()` a plain connection."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        self.url = url
        self.sqlite = is_sqlite(url)
        # A pool as large as the requests in flight: a connection opened past the pool's size
        # is closed again when returned, and on SQLite each is a thread, a file and four PRAGMAs.
        engine_options.setdefault("pool_size", 20)
        engine_options.setdefault("max_overflow", 20)
        if self.sqlite:
            # No transaction is ever left open on a returned connection (reads run without one,
            # writes commit or roll back), so resetting each connection is a wasted round trip.
            engine_options.setdefault("pool_reset_on_return", None)
        self.engine = create_engine(url, **engine_options)
        self._reader = self.engine.execution_options(**{_READ: True})
        self._write_lock: asyncio.Lock | None = None
        if self.sqlite:
            _explicit_sqlite_transactions(self.engine.sync_engine)
            self._write_lock = asyncio.Lock()
        self.outbox_written = asyncio.Event()
        """Set after a commit that wrote outbox rows, so the relay publishes them at once."""
        self.inserts = InsertBatcher(self)
        """Group commit for requests whose change is inserts only (see `batching.py`)."""

    async def migrate(self) -> None:
        """Bring the tables to the latest migration (a second run changes nothing)."""
        await upgrade(self.engine, MIGRATIONS, version_table=VERSION_TABLE)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self._reader.connect() as conn:
            yield conn

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """One transaction, committed when the block ends without an exception."""
        if self._write_lock is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_lock, self.engine.connect() as conn:
            await conn.execution_options(**{_WRITE: True})
            async with conn.begin():
                yield conn

    async def ping(self) -> None:
        async with self.read() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def close(self) -> None:
        await self.inserts.close()
        await self.engine.dispose()


async def insert_ignore(
    conn: AsyncConnection, table: sa.Table, values: Mapping[str, Any], *, keys: list[str]
) -> bool:
    """Insert a row unless one with the same `keys` exists; True when it was inserted.

    The conflict is resolved by the database (`ON CONFLICT DO NOTHING`), so a Postgres
    transaction is not aborted by a duplicate.
    """
    dialect = sqlite if conn.dialect.name == "sqlite" else postgresql
    stmt = dialect.insert(table).values(dict(values)).on_conflict_do_nothing(index_elements=keys)
    result = await conn.execute(stmt)
    return bool(result.rowcount == 1)


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
