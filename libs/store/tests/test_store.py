"""The store against real SQLite and real Postgres: engines and migrations from empty."""

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from einsora.common.errors import ConfigError
from einsora.store import create_engine, is_sqlite, upgrade

MIGRATIONS = Path(__file__).parent / "sample_migrations"


async def test_migrations_from_empty_then_again_change_nothing(store_url: str) -> None:
    engine = create_engine(store_url)
    try:
        await upgrade(engine, MIGRATIONS, version_table="alembic_version_sample")
        await upgrade(engine, MIGRATIONS, version_table="alembic_version_sample")
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
            version = (
                (await conn.execute(sa.text("SELECT version_num FROM alembic_version_sample")))
                .scalars()
                .all()
            )
        assert "widgets" in tables
        assert version == ["0001"]
    finally:
        await engine.dispose()


async def test_foreign_keys_are_enforced(store_url: str) -> None:
    engine = create_engine(store_url)
    try:
        await upgrade(engine, MIGRATIONS, version_table="alembic_version_sample")
        with pytest.raises(IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(
                    sa.text("INSERT INTO widgets (id, parent_id) VALUES ('a', 'missing')")
                )
    finally:
        await engine.dispose()


async def test_sqlite_runs_in_wal_mode(sqlite_url: str) -> None:
    assert is_sqlite(sqlite_url)
    engine = create_engine(sqlite_url)
    try:
        async with engine.connect() as conn:
            mode = (await conn.execute(sa.text("PRAGMA journal_mode"))).scalar_one()
        assert mode == "wal"
    finally:
        await engine.dispose()


def test_an_unsupported_url_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mysql"):
        create_engine("mysql://localhost/x")
