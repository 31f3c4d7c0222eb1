"""Async engines for `sqlite+aiosqlite` (WAL, foreign keys on) and `postgresql+asyncpg`."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from einsora.common.errors import ConfigError

_SUPPORTED = ("sqlite+aiosqlite", "postgresql+asyncpg")


def is_sqlite(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def is_postgres(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


_BUSY_TIMEOUT_S = 5.0


def on_sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
    _write_ahead_log(cursor)
    # NORMAL is durable in WAL mode up to the last checkpointed transaction and much faster
    # than FULL.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _write_ahead_log(cursor: Any) -> None:
    """Put the file in WAL mode (readers proceed while one writer commits), waiting for it.

    Switching a new file to WAL needs it to itself, and SQLite answers "database is locked" at
    once, without its busy handler, when another process is opening or migrating the same new
    file (two schedulers of a cell starting together). The mode is kept in the file, so this
    waits only on a file's first opening; the short blocking sleeps happen then alone.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except Exception as error:  # the driver's OperationalError, through the async adapter
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            if time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _private_sqlite_file(path: Path) -> None:
    """The database file (and its WAL and shared-memory files) readable by us alone.

    It holds token hashes and every tenant's workloads. SQLite makes the `-wal` and `-shm`
    files with the database file's mode, so the file is made 0600 before SQLite opens it.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if each.stat().st_mode & 0o077:
                os.chmod(each, 0o600)


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for a supported URL; SQLite files get their parent directory created."""
    parsed = make_url(url)
    if parsed.drivername not in _SUPPORTED:
        raise ConfigError(
            f"unsupported database URL scheme {parsed.drivername!r}: use one of "
            + ", ".join(_SUPPORTED)
        )
    if is_sqlite(parsed):
        # aiosqlite logs every statement with its parameters at DEBUG, and parameters include
        # secrets (a workload's own token): never let those lines exist.
        quiet = logging.getLogger("aiosqlite")
        if quiet.getEffectiveLevel() < logging.INFO or quiet.level < logging.INFO:
            quiet.setLevel(logging.INFO)
        if parsed.database and parsed.database != ":memory:":
            _private_sqlite_file(Path(parsed.database))
        engine = create_async_engine(parsed, **kwargs)
        event.listen(engine.sync_engine, "connect", on_sqlite_connect)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(parsed, **kwargs)
