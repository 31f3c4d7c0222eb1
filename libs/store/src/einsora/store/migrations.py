"""Applying a service's Alembic migrations on start, against an async engine.

Each service keeps its migrations in its own package (`einsora/<service>/migrations`) with an
`env.py` that calls `run_env()`, and its version in `alembic_version_<service>`.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command, context
from alembic.config import Config
from sqlalchemy import Connection, MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from einsora.store.engine import is_sqlite


def _config(script_location: Path, version_table: str, target_metadata: MetaData | None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.attributes["version_table"] = version_table
    cfg.attributes["target_metadata"] = target_metadata
    return cfg


async def upgrade(
    engine: AsyncEngine,
    script_location: Path,
    *,
    version_table: str,
    target_metadata: MetaData | None = None,
    revision: str = "head",
) -> None:
    """Bring the database to `revision`; a second run changes nothing."""
    cfg = _config(script_location, version_table, target_metadata)

    def run(connection: Connection) -> None:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)


def run_env() -> None:
    """The body of every service's `migrations/env.py` (online mode only)."""
    cfg = context.config
    connection: Connection = cfg.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=cfg.attributes.get("target_metadata"),
        version_table=cfg.attributes["version_table"],
        render_as_batch=is_sqlite(connection.engine.url),
    )
    with context.begin_transaction():
        context.run_migrations()
