"""Alembic environment of accounting's tables (version table `alembic_version_accounting`)."""

from einsora.store.migrations import run_env

run_env()
