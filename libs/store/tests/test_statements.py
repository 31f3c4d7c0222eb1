"""`statements.execute`: a hot INSERT or UPDATE handed to the driver stores exactly what
`Connection.execute` stores, and fails the way it fails, on both engines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from einsora.store import Database, UtcDateTime, statements

_meta = sa.MetaData()
things = sa.Table(
    "things",
    _meta,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("at", UtcDateTime(), nullable=False),
    sa.Column("size", sa.Float, nullable=True),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("kind", sa.String(16), nullable=False, default="plain"),
)
logged = sa.Table(
    "logged",
    _meta,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("what", sa.String(32), nullable=False),
)

_INSERT = sa.insert(things)
_INSERT_LOGGED = sa.insert(logged)
_RENAME = (
    sa.update(things)
    .where(things.c.id == sa.bindparam("b_id"))
    .values(note=sa.bindparam("b_note"), at=sa.bindparam("b_at"))
)


def _row(thing_id: str, **changes: Any) -> dict[str, Any]:
    return {
        "id": thing_id,
        # Not UTC, with microseconds: the stored text must be what SQLAlchemy makes of it.
        "at": datetime(2026, 12, 3, 21, 0, 5, 120, tzinfo=timezone(timedelta(hours=2))),
        "size": 1.5,
        "count": 3,
        "note": "naïve 'quoted' \"text\"",
        "kind": "special",
    } | changes


async def _made(url: str) -> Database:
    db = Database(url)
    async with db.write() as conn:
        await conn.run_sync(_meta.create_all)
    return db


def _stored(conn: sa.Connection) -> list[tuple[Any, ...]]:
    """The things as the database holds them (no type processing on the way out)."""
    return [tuple(r) for r in conn.exec_driver_sql("SELECT * FROM things ORDER BY 1")]


async def test_rows_are_stored_exactly_as_connection_execute_stores_them(store_url: str) -> None:
    db = await _made(store_url)
    await db.run(lambda conn: conn.execute(_INSERT, [_row("a1"), _row("a2", size=None)]))
    await db.run(
        lambda conn: statements.execute(conn, _INSERT, [_row("b1"), _row("b2", size=None)])
    )
    await db.run(lambda conn: statements.execute(conn, _INSERT, _row("c1", note=None)))
    rows = {r[0]: r[1:] for r in await db.query(lambda conn: _stored(conn))}
    assert rows["b1"] == rows["a1"]
    assert rows["b2"] == rows["a2"]
    assert rows["c1"] == (*rows["a1"][:3], None, "special")
    async with db.read() as conn:  # and read back through the column types, in UTC
        at = await conn.scalar(sa.select(things.c.at).where(things.c.id == "b1"))
    assert at == datetime(2026, 12, 3, 19, 0, 5, 120, tzinfo=UTC)
    await db.close()


async def test_an_in_memory_database_stores_the_same(sqlite_url: str) -> None:
    # Its units run through aiosqlite, not on the store's threads: SQLAlchemy executes them.
    rows = []
    for url in (sqlite_url, "sqlite+aiosqlite://"):
        db = await _made(url)
        await db.run(lambda conn: statements.execute(conn, _INSERT, [_row("a"), _row("b")]))
        rows.append(await db.query(_stored))
        await db.close()
    assert rows[0] == rows[1]


async def test_an_update_by_bound_parameters_changes_the_rows_named(store_url: str) -> None:
    db = await _made(store_url)
    await db.run(lambda conn: statements.execute(conn, _INSERT, [_row("a"), _row("b")]))
    later = datetime(2027, 1, 1, tzinfo=UTC)
    done = await db.run(
        lambda conn: statements.execute(
            conn,
            _RENAME,
            [
                {"b_id": "a", "b_note": "one", "b_at": later},
                {"b_id": "z", "b_note": "-", "b_at": later},
            ],
        )
    )
    assert done.rowcount in (1, -1)  # asyncpg's executemany does not count
    async with db.read() as conn:
        notes = {r.id: r.note for r in await conn.execute(sa.select(things.c.id, things.c.note))}
        at = await conn.scalar(sa.select(things.c.at).where(things.c.id == "a"))
    assert notes == {"a": "one", "b": _row("b")["note"]}
    assert at == later
    await db.close()


async def test_a_single_insert_gives_its_new_key(store_url: str) -> None:
    db = await _made(store_url)
    first = await db.run(lambda conn: statements.execute(conn, _INSERT_LOGGED, {"what": "x"}))
    second = await db.run(lambda conn: statements.execute(conn, _INSERT_LOGGED, {"what": "y"}))
    assert second.new_key == first.new_key + 1
    async with db.read() as conn:
        what = await conn.scalar(sa.select(logged.c.what).where(logged.c.seq == second.new_key))
    assert what == "y"
    await db.close()


async def test_a_duplicate_raises_sqlalchemys_integrity_error_and_the_unit_rolls_back(
    store_url: str,
) -> None:
    db = await _made(store_url)
    await db.run(lambda conn: statements.execute(conn, _INSERT, _row("a")))

    def twice(conn: sa.Connection) -> None:
        statements.execute(conn, _INSERT, _row("new"))
        statements.execute(conn, _INSERT, _row("a"))

    with pytest.raises(sa.exc.IntegrityError):
        await db.run(twice)
    ids = await db.query(lambda conn: [r[0] for r in _stored(conn)])
    assert ids == ["a"]  # the unit's first row went with it
    await db.close()


async def test_a_column_default_is_filled_when_the_row_leaves_it_out(store_url: str) -> None:
    db = await _made(store_url)
    row = _row("a")
    del row["kind"]  # a Python-side default: SQLAlchemy's to fill
    await db.run(lambda conn: statements.execute(conn, _INSERT, row))
    kinds = await db.query(lambda conn: [r[-1] for r in _stored(conn)])
    assert kinds == ["plain"]
    await db.close()


async def test_an_insert_ignoring_conflicts_skips_what_exists(sqlite_url: str) -> None:
    db = await _made(sqlite_url)
    ignoring = sqlite.insert(things).on_conflict_do_nothing(index_elements=["id"])
    await db.run(lambda conn: statements.execute(conn, _INSERT, _row("a", count=1)))
    done = await db.run(
        lambda conn: statements.execute(conn, ignoring, [_row("a", count=2), _row("b", count=2)])
    )
    assert done.rowcount == 1
    counts = await db.query(lambda conn: [r[3] for r in _stored(conn)])
    assert counts == [1, 2]
    await db.close()
