"""The api's store: its database (einsora.store's transaction policy and units of work) and its
migrations."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from einsora.store import Database

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_api"


class Store(Database):
    """The database the api owns: `run()`/`query()` take a unit of work in one call (the hot
    paths: launches, actions, the timeline, the outbox, tokens), `write()`/`read()` the rest."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        # Sized to the work rather than to the requests in flight: the hot paths run on the
        # unit writer and readers, and only the colder routes hold one of these.
        engine_options.setdefault("pool_size", 4)
        engine_options.setdefault("max_overflow", 4)
        super().__init__(url, **engine_options)
        self.outbox_written = asyncio.Event()
        """Set after a commit that wrote outbox rows, so the relay publishes them at once."""

    async def migrate(self) -> None:  # type: ignore[override]
        """Bring the api's tables to the latest migration (a second run changes nothing)."""
        await super().migrate(MIGRATIONS, version_table=VERSION_TABLE)


def insert_ignore(
    conn: sa.Connection, table: sa.Table, values: Mapping[str, Any], *, keys: list[str]
) -> bool:
    """Insert a row unless one with the same `keys` exists; True when it was inserted.

    The conflict is resolved by the database (`ON CONFLICT DO NOTHING`), so a Postgres
    transaction is not aborted by a duplicate.
    """
    result = conn.execute(_insert_ignoring(conn.dialect.name, table, tuple(keys)), dict(values))
    return bool(result.rowcount == 1)


@functools.cache
def _insert_ignoring(dialect_name: str, table: sa.Table, keys: tuple[str, ...]) -> Any:
    """One statement per table and keys (parameters apart), so it is compiled once."""
    dialect = sqlite if dialect_name == "sqlite" else postgresql
    return dialect.insert(table).on_conflict_do_nothing(index_elements=list(keys))
