"""Hot statements at the driver's cost: a unit's INSERTs and UPDATEs handed straight to SQLite.

`Connection.execute` spends about 30 µs of Python on each statement (its cache key, the
parameters' construction, the result's set-up) beside the 20 µs SQLite itself takes to insert a
launch's workload row, and a launch writes four rows. `execute` compiles a statement once per
dialect and parameter names, keeps the bind processors SQLAlchemy would apply (so what is
stored is byte for byte what `Connection.execute` stores), and hands the rows to the DBAPI
cursor of the unit's connection, inside its transaction. Errors come out as SQLAlchemy's own
(`IntegrityError` for a duplicate key), so callers catch what they always caught.

Only SQLite through its own driver (the store's unit threads) goes this way. Postgres (asyncpg
under `run_sync`) and an in-memory SQLite (aiosqlite) keep `Connection.execute`, as does any
statement whose compiled form needs more than the caller's parameters (a Python-side column
default, an expanding `IN`): SQLAlchemy fills those at execution time.

Statements must be built once (module constants), since each is compiled once per identity.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

Processor = Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class Executed:
    """What a statement did: rows it changed, and a single-row INSERT's new primary key."""

    rowcount: int
    new_key: Any = None


@dataclass(frozen=True, slots=True)
class _Prepared:
    sql: str
    names: tuple[str, ...]
    processors: tuple[Processor, ...]


_prepared: dict[tuple[int, str, tuple[str, ...]], tuple[sa.Executable, _Prepared | None]] = {}
_lock = threading.Lock()
_MOST_PREPARED = 4096


def execute(
    conn: sa.Connection,
    statement: sa.Executable,
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> Executed:
    """Run `statement` with one row of parameters, or with many (all naming the same keys), in
    the connection's open transaction."""
    many = not isinstance(params, Mapping)
    rows: Sequence[Mapping[str, Any]] = params if many else [params]  # type: ignore[list-item,assignment]
    if not rows:
        return Executed(0)
    dialect = conn.dialect
    fast = dialect.name == "sqlite" and dialect.driver == "pysqlite"
    prepared = _prepare(dialect, statement, tuple(rows[0])) if fast else None
    if prepared is None:
        result = conn.execute(statement, params)
        key = None
        if not many and isinstance(statement, sa.Insert) and result.inserted_primary_key:
            key = result.inserted_primary_key[0]
        return Executed(result.rowcount, key)
    values = [_values(prepared, row) for row in rows]
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    try:
        if many:
            cursor = dbapi.executemany(prepared.sql, values)
            return Executed(cursor.rowcount)
        cursor = dbapi.execute(prepared.sql, values[0])
        return Executed(cursor.rowcount, cursor.lastrowid)
    except dialect.loaded_dbapi.Error as exc:
        raise sa.exc.DBAPIError.instance(
            prepared.sql,
            values if many else values[0],
            exc,
            dialect.loaded_dbapi.Error,
            dialect=dialect,
            ismulti=many,
        ) from exc


def _values(prepared: _Prepared, row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(
        row[name] if process is None else process(row[name])
        for name, process in zip(prepared.names, prepared.processors, strict=True)
    )


def _prepare(dialect: Dialect, statement: sa.Executable, keys: tuple[str, ...]) -> _Prepared | None:
    """The statement compiled for these parameter names (None: it needs SQLAlchemy to run)."""
    cache_key = (id(statement), dialect.name, keys)
    entry = _prepared.get(cache_key)
    if entry is not None and entry[0] is statement:
        return entry[1]
    compiled = statement.compile(dialect=dialect, column_keys=list(keys))  # type: ignore[attr-defined]
    names = tuple(compiled.positiontup or ())
    ready: _Prepared | None = None
    # Every placeholder must be one of the caller's parameters, in a positional style: a
    # Python-side default or an expanding parameter is SQLAlchemy's to fill.
    if (
        dialect.positional
        and names
        and set(names) <= set(keys)
        and not compiled.literal_execute_params
        and not any(compiled.binds[name].expanding for name in names)
    ):
        processors = compiled._bind_processors  # what Connection.execute applies, exactly
        ready = _Prepared(str(compiled), names, tuple(processors.get(n) for n in names))
    with _lock:
        # Statements built per call would fill it: a caller's bug, which must not become a leak.
        if len(_prepared) >= _MOST_PREPARED:
            _prepared.clear()
        _prepared[cache_key] = (statement, ready)
    return ready
