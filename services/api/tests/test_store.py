"""The store on both engines: migrations from empty match the tables in code, run twice change
nothing, and times come back aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from einsora.api import models
from einsora.api.bootstrap import ensure_owner
from einsora.api.store import MIGRATIONS, VERSION_TABLE, Store, insert_ignore


async def test_migrations_match_the_models_and_are_idempotent(store_url: str) -> None:
    store = Store(store_url)
    try:
        await store.migrate()
        await store.migrate()
        async with store.read() as conn:

            def diff(sync_conn: sa.Connection) -> list[object]:
                context = MigrationContext.configure(
                    sync_conn, opts={"version_table": VERSION_TABLE}
                )
                return list(compare_metadata(context, models.metadata))

            differences = await conn.run_sync(diff)
            versions = (
                (await conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")))  # noqa: S608
                .scalars()
                .all()
            )
        assert differences == []
        assert versions == [ScriptDirectory(str(MIGRATIONS)).get_current_head()]
    finally:
        await store.close()


async def test_times_are_stored_utc_and_read_back_aware(store_url: str) -> None:
    store = Store(store_url)
    try:
        await store.migrate()
        at = datetime(2026, 11, 29, 13, 30, tzinfo=timezone(timedelta(hours=1)))
        async with store.write() as conn:
            await conn.execute(
                sa.insert(models.tenants).values(id="t-1", name="one", created_at=at)
            )
        async with store.read() as conn:
            back = await conn.scalar(sa.select(models.tenants.c.created_at))
        assert back == at
        assert back is not None
        assert back.tzinfo is UTC
        assert back.hour == 12
    finally:
        await store.close()


async def test_insert_ignore_keeps_the_first_row_without_aborting(store_url: str) -> None:
    store = Store(store_url)
    now = datetime.now(UTC)
    try:
        await store.migrate()
        row = {"id": "t-1", "name": "one", "created_at": now}

        def unit(conn: sa.Connection) -> tuple[bool, bool]:
            first = insert_ignore(conn, models.tenants, row, keys=["id"])
            second = insert_ignore(conn, models.tenants, {**row, "name": "two"}, keys=["id"])
            # The transaction is still usable after the conflict (Postgres would abort it).
            conn.execute(sa.insert(models.tenants).values(id="t-2", name="two", created_at=now))
            return first, second

        assert await store.run(unit) == (True, False)
        async with store.read() as conn:
            names = (
                (await conn.execute(sa.select(models.tenants.c.name).order_by("id")))
                .scalars()
                .all()
            )
        assert names == ["one", "two"]
    finally:
        await store.close()


async def test_the_owner_is_made_once(store_url: str, tmp_path: Path) -> None:
    store = Store(store_url)
    try:
        await store.migrate()
        first = await ensure_owner(store, tmp_path)
        assert first is not None
        assert first.startswith("tsk_")
        assert await ensure_owner(store, tmp_path) is None
        assert (tmp_path / "owner.token").read_text().strip() == first
        async with store.read() as conn:
            users = (
                await conn.execute(sa.select(models.users.c.username, models.users.c.is_operator))
            ).all()
        assert [tuple(u) for u in users] == [("owner", True)]
    finally:
        await store.close()
