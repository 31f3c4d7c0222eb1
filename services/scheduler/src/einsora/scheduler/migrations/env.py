"""Alembic environment of the scheduler's tables (version table `alembic_version_scheduler`)."""

from einsora.store.migrations import run_env

run_env()
