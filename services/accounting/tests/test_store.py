"""Accounting's store on both engines: migrations from empty make exactly the tables in code,
and a second run changes nothing."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from einsora.accounting import tables
from einsora.accounting.store import MIGRATIONS, VERSION_TABLE, AccountingStore


async def test_migrations_match_the_tables_and_are_idempotent(store_url: str) -> None:
    store = AccountingStore(store_url)
    try:
        await store.migrate()
        await store.migrate()
        async with store.read() as conn:

            def diff(sync_conn: sa.Connection) -> list[object]:
                context = MigrationContext.configure(
                    sync_conn, opts={"version_table": VERSION_TABLE}
                )
                return list(compare_metadata(context, tables.metadata))

            differences = await conn.run_sync(diff)
            versions = (
                (await conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")))  # noqa: S608
                .scalars()
                .all()
            )
        assert differences == []
        assert versions == [ScriptDirectory(str(MIGRATIONS)).get_current_head()]
        assert all(name.startswith("accounting_") for name in tables.metadata.tables)
    finally:
        await store.close()
