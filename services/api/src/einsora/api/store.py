"""The api's store: its database (einsora.store's transaction policy), migrations, and group
commit for launches."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api.batching import InsertBatcher
from einsora.store import Database

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_api"


class Store(Database):
    """The database the api owns; `write()` is a transaction, `read()` a plain connection."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        # A pool as large as the requests in flight: a connection opened past the pool's size
        # is closed again when returned, and on SQLite each is a thread, a file and four PRAGMAs.
        engine_options.setdefault("pool_size", 20)
        engine_options.setdefault("max_overflow", 20)
        super().__init__(url, **engine_options)
        self.outbox_written = asyncio.Event()
        """Set after a commit that wrote outbox rows, so the relay publishes them at once."""
        self.inserts = InsertBatcher(self)
        """Group commit for requests whose change is inserts only (see `batching.py`)."""

    async def migrate(self) -> None:  # type: ignore[override]
        """Bring the api's tables to the latest migration (a second run changes nothing)."""
        await super().migrate(MIGRATIONS, version_table=VERSION_TABLE)

    async def close(self) -> None:
        await self.inserts.close()
        await super().close()


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
