"""The store's one transaction policy and its one UTC datetime type, on both engines."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from einsora.store import Database, UtcDateTime

_meta = sa.MetaData()
counters = sa.Table(
    "counters",
    _meta,
    sa.Column("name", sa.String(16), primary_key=True),
    sa.Column("value", sa.Integer, nullable=False),
)
times = sa.Table(
    "times",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("plain", UtcDateTime(), nullable=True),
    sa.Column("zoned", UtcDateTime(timezone=True), nullable=True),
)


async def _made(url: str) -> Database:
    db = Database(url)
    async with db.write() as conn:
        await conn.run_sync(_meta.create_all)
    return db


async def test_two_services_on_one_sqlite_file_take_turns(sqlite_url: str) -> None:
    """Solo's api and scheduler share one file: read-then-write transactions from both, all at
    once, neither fail (SQLITE_BUSY_SNAPSHOT) nor lose an update."""
    api, scheduler = await _made(sqlite_url), Database(sqlite_url)
    async with api.write() as conn:
        await conn.execute(counters.insert().values(name="n", value=0))

    async def bump(db: Database) -> None:
        async with db.write() as conn:
            value = await conn.scalar(sa.select(counters.c.value).where(counters.c.name == "n"))
            await asyncio.sleep(0)  # let the other service try to write in between
            await conn.execute(counters.update().values(value=int(value or 0) + 1))

    await asyncio.gather(*(bump(db) for _ in range(50) for db in (api, scheduler)))
    async with scheduler.read() as conn:
        assert await conn.scalar(sa.select(counters.c.value)) == 100
    await api.close()
    await scheduler.close()


async def test_times_are_aware_utc_and_naive_ones_are_refused(store_url: str) -> None:
    db = await _made(store_url)
    local = timezone(timedelta(hours=5, minutes=30))
    moment = datetime(2026, 12, 1, 15, 30, tzinfo=local)
    async with db.write() as conn:
        await conn.execute(times.insert().values(id=1, plain=moment, zoned=moment))
    async with db.read() as conn:
        row = (await conn.execute(sa.select(times))).one()
    for value in (row.plain, row.zoned):
        assert value == moment
        assert value.tzinfo is UTC
        assert value.hour == 10
    with pytest.raises(sa.exc.StatementError, match="naive datetimes are not stored"):
        async with db.write() as conn:
            await conn.execute(times.insert().values(id=2, zoned=datetime(2026, 12, 1, 15, 30)))
    async with db.read() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(times)) == 1
    await db.close()
