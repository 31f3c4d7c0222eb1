"""Pytest fixtures for the store (loaded as the `einsora-store` pytest plugin).

`store_url` runs a test against both engines: a fresh SQLite file, and a fresh Postgres database
when a server answers at 127.0.0.1:5432 (or `EINSORA_TEST_POSTGRES_URL`). Where none answers, the
Postgres case is skipped with that reason, never silently.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

DEFAULT_POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"


def _admin_dsn(url: str) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


@pytest_asyncio.fixture(scope="session")
async def postgres_server() -> str:
    """The admin URL of a reachable Postgres server; skips with the reason when none answers."""
    url = os.environ.get("EINSORA_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    try:
        conn = await asyncio.wait_for(asyncpg.connect(_admin_dsn(url)), timeout=3)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        pytest.skip(
            f"no PostgreSQL answers at {make_url(url).render_as_string(hide_password=True)} "
            f"({exc.__class__.__name__}: {exc}); set EINSORA_TEST_POSTGRES_URL to test Postgres"
        )
    await conn.close()
    return url


@pytest_asyncio.fixture
async def postgres_url(postgres_server: str) -> AsyncIterator[str]:
    """A fresh, empty Postgres database for one test, dropped afterwards."""
    name = f"einsora_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(_admin_dsn(postgres_server))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield make_url(postgres_server).set(database=name).render_as_string(hide_password=False)
    admin = await asyncpg.connect(_admin_dsn(postgres_server))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """The same test on SQLite and on Postgres."""
    if request.param == "sqlite":
        return sqlite_url
    url: str = request.getfixturevalue("postgres_url")
    return url
