"""Einsora's store: async SQLAlchemy engines and per-service Alembic migrations.

Only services that own tables (api, scheduler, accounting) depend on this package; the agent
never does. Each service owns its tables and its migrations, and records its migration version
in a table of its own, so services can share one database file in Solo without sharing tables.
"""

from einsora.store.database import Database
from einsora.store.engine import create_engine, is_postgres, is_sqlite
from einsora.store.migrations import upgrade
from einsora.store.types import UtcDateTime

__all__ = ["Database", "UtcDateTime", "create_engine", "is_postgres", "is_sqlite", "upgrade"]
