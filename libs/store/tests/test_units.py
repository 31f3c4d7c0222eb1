"""Units of work (`Database.run` / `Database.query`): one call per transaction, concurrent
units committed together on SQLite, and one unit's failure kept to itself, on both engines."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from einsora.store import Database

_meta = sa.MetaData()
items = sa.Table(
    "items",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(16), nullable=False, unique=True),
)
counters = sa.Table(
    "counters",
    _meta,
    sa.Column("name", sa.String(16), primary_key=True),
    sa.Column("value", sa.Integer, nullable=False),
)


async def _made(url: str) -> Database:
    db = Database(url)
    async with db.write() as conn:
        await conn.run_sync(_meta.create_all)
    return db


def _insert(item_id: int, name: str) -> Callable[[sa.Connection], int]:
    def unit(conn: sa.Connection) -> int:
        conn.execute(items.insert().values(id=item_id, name=name))
        return item_id

    return unit


def _count(conn: sa.Connection) -> int:
    return int(conn.scalar(sa.select(sa.func.count()).select_from(items)) or 0)


async def test_a_unit_commits_and_returns_its_value(store_url: str) -> None:
    db = await _made(store_url)
    assert await db.run(_insert(1, "one")) == 1
    assert await db.query(_count) == 1
    async with db.read() as conn:  # and the async engine sees the commit
        assert await conn.scalar(sa.select(items.c.name)) == "one"
    await db.close()


async def test_concurrent_units_all_commit_and_share_commits(store_url: str) -> None:
    db = await _made(store_url)
    ids = await asyncio.gather(*(db.run(_insert(i, f"n{i}")) for i in range(200)))
    assert sorted(ids) == list(range(200))
    assert await db.query(_count) == 200
    assert db.commits < 200, "concurrent units were not merged"
    await db.close()


async def test_a_failing_unit_is_rolled_back_alone_and_gets_its_own_error(store_url: str) -> None:
    """Among concurrent units, one that breaks a constraint, and one that raises after writing,
    keep nothing of theirs; the others commit."""
    db = await _made(store_url)
    await db.run(_insert(1, "taken"))

    def writes_then_raises(conn: sa.Connection) -> None:
        conn.execute(items.insert().values(id=500, name="half-done"))
        raise LookupError("refused by the unit itself")

    outcomes = await asyncio.gather(
        *(db.run(_insert(i, f"n{i}")) for i in range(2, 40)),
        db.run(_insert(99, "taken")),
        db.run(writes_then_raises),
        *(db.run(_insert(i, f"n{i}")) for i in range(40, 80)),
        return_exceptions=True,
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 2
    assert any(isinstance(e, sa.exc.IntegrityError) for e in errors)
    assert any(isinstance(e, LookupError) and "refused" in str(e) for e in errors)

    def names(conn: sa.Connection) -> set[str]:
        return set(conn.scalars(sa.select(items.c.name)))

    stored = await db.query(names)
    assert "half-done" not in stored
    assert stored == {"taken", *(f"n{i}" for i in range(2, 80))}
    await db.close()


async def test_units_and_write_blocks_take_turns_without_losing_an_update(
    sqlite_url: str,
) -> None:
    """SQLite: read-then-write from units and from `write()` blocks at once (one writer at a
    time, whichever the path): none fails, none is lost."""
    db = await _made(sqlite_url)
    await db.run(lambda conn: conn.execute(counters.insert().values(name="n", value=0)))

    def bump_unit(conn: sa.Connection) -> None:
        value = conn.scalar(sa.select(counters.c.value).where(counters.c.name == "n"))
        conn.execute(counters.update().values(value=int(value or 0) + 1))

    async def bump_block() -> None:
        async with db.write() as conn:
            value = await conn.scalar(sa.select(counters.c.value).where(counters.c.name == "n"))
            await asyncio.sleep(0)
            await conn.execute(counters.update().values(value=int(value or 0) + 1))

    await asyncio.gather(*(f for _ in range(60) for f in (db.run(bump_unit), bump_block())))
    assert await db.query(lambda conn: conn.scalar(sa.select(counters.c.value))) == 120
    await db.close()


async def test_a_closed_store_refuses_units(sqlite_url: str) -> None:
    db = await _made(sqlite_url)
    await db.close()
    with pytest.raises(RuntimeError, match="closed"):
        await db.run(_insert(1, "late"))
