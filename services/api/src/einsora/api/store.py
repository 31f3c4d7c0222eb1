"""The api's store: its database (einsora.store's transaction policy and units of work), its
migrations, and the activity log's writing.

**The activity log is written in the transaction of the change it records**, so an action
without its record cannot exist. The edge (`middleware.py`) binds an `Action` to every mutating
request, in a context variable; the route's dependency arms it once it knows the route and who
calls (`deps.py`). The first write transaction of that request (`Store.run()`, `Store.write()`)
then inserts the action's row before it commits: inside the unit itself for a unit of work, so
a launch that shares a group commit with others records itself in that same commit, one row
each, with no round trip of its own. A request that wrote nothing (it failed, or changed
nothing) has its row written when it answers, in its own transaction (`settle`), and a row
whose request answered otherwise than the route's own status (a 404 after a write that matched
nothing) is corrected then. Exactly one row per armed request.

Only the request's own task records: a task it started (the unit writer, a publish) inherits
the context variable, but must never write the request's row.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api import models as m
from einsora.store import Database, statements
from einsora.store.units import Unit

T = TypeVar("T")
log = logging.getLogger("einsora.api.activity")

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_api"


class Store(Database):
    """The database the api owns: `run()`/`query()` take a unit of work in one call (the hot
    paths: launches, actions, the timeline, the outbox, tokens), `write()`/`read()` the rest."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        # Sized to the work rather than to the requests in flight: the hot paths run on the
        # unit writer and readers, and only the colder routes hold one of these.
        engine_options.setdefault("pool_size", 4)
        engine_options.setdefault("max_overflow", 4)
        super().__init__(url, **engine_options)
        self.outbox_written = asyncio.Event()
        """Set after a commit that wrote outbox rows, so the relay publishes them at once."""

    async def migrate(self) -> None:  # type: ignore[override]
        """Bring the api's tables to the latest migration (a second run changes nothing)."""
        await super().migrate(MIGRATIONS, version_table=VERSION_TABLE)

    async def run(self, unit: Unit[T]) -> T:
        """`Database.run`, recording the request's armed action inside the unit."""
        action = _recordable()
        if action is None:
            return await super().run(unit)

        def recorded(conn: sa.Connection) -> T:
            value = unit(conn)
            if action.tenant_id is not None:  # built here: the unit may have named the target
                action.seq = statements.execute(conn, _INSERT_ACTIVITY, action.row()).new_key
            return value

        value = await super().run(recorded)
        action.recorded = action.seq is not None
        return value

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """`Database.write`, recording the request's armed action before the commit."""
        action = _recordable()
        async with super().write() as conn:
            yield conn
            if action is not None and action.tenant_id is not None:
                result = await conn.execute(_INSERT_ACTIVITY, action.row())
                action.seq = result.inserted_primary_key[0] if result.inserted_primary_key else None
        if action is not None:
            action.recorded = action.seq is not None

    @contextlib.asynccontextmanager
    async def write_aside(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction that records no action (the activity log's own writes)."""
        async with super().write() as conn:
            yield conn


@dataclass(slots=True)
class Action:
    """What one request (or bus request) records in the activity log: made unarmed by the edge
    for every mutating request, armed once the route and the caller are known (`arm`).

    Only an armed action with a tenant is ever written: a request nobody could be named for
    (no valid token) answers the access log alone.
    """

    request_id: str
    method: str
    owner: asyncio.Task[Any] | None
    """The task that may record it (the request's own)."""
    armed: bool = False
    store: Store | None = None
    name: str = ""
    """The action's stable name, e.g. `workload.create` (`services/activity.py`)."""
    route: str = ""
    """Method and route template, e.g. `POST /v1/workloads/{id}/park`."""
    at: datetime | None = None
    tenant_id: str | None = None
    user_id: str | None = None
    token_id: str | None = None
    target: str | None = None
    status: int = 200
    """What the request answers when the write succeeds (the route's own status)."""
    seq: int | None = None
    """The row's key once written."""
    recorded: bool = False

    def arm(
        self,
        store: Store,
        *,
        name: str,
        route: str,
        at: datetime,
        status: int,
        target: str | None = None,
    ) -> None:
        self.store, self.name, self.route, self.at = store, name, route, at
        self.status, self.target, self.armed = status, target, True

    def row(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "token_id": self.token_id,
            "action": self.name,
            "route": self.route,
            "target": self.target,
            "outcome": outcome_of(self.status),
            "status": self.status,
            "request_id": self.request_id,
        }


_ACTION: ContextVar[Action | None] = ContextVar("einsora_api_action", default=None)
_INSERT_ACTIVITY = sa.insert(m.activity)


def outcome_of(status: int) -> str:
    """`ok` for what succeeded (2xx, 3xx), `failed` for the rest."""
    return "ok" if status < 400 else "failed"


@contextlib.contextmanager
def bound(action: Action) -> Iterator[Action]:
    """`action` is the current request's, in this context, until the block ends."""
    token = _ACTION.set(action)
    try:
        yield action
    finally:
        _ACTION.reset(token)


def current_action() -> Action | None:
    """The action bound to this request, armed or not (None outside a mutating request)."""
    return _ACTION.get()


def _recordable() -> Action | None:
    action = _ACTION.get()
    if action is None or not action.armed or action.recorded:
        return None
    if action.owner is not asyncio.current_task():
        return None  # a task the request started: never its record
    return action


def activity_target(target: str) -> None:
    """Name what the current request acts on, unless its route named it (a new object's id,
    for a route that makes one)."""
    action = _ACTION.get()
    if action is not None and action.target is None:
        action.target = target


def activity_actor(*, tenant_id: str, user_id: str | None, token_id: str | None = None) -> None:
    """Name who acts, for a request that no API token authenticated (a machine joining with a
    join token, a new user redeeming an invitation, the proxy redeeming a ticket); a second
    call adds what the first did not know (the user once made)."""
    action = _ACTION.get()
    if action is None or action.tenant_id not in (None, tenant_id):
        return  # an authenticated caller is who acts, whatever the route's service says
    action.tenant_id = tenant_id
    action.user_id = action.user_id or user_id
    action.token_id = action.token_id or token_id


def activity_refused(status: int) -> None:
    """The current request is refused with `status`, though what it wrote commits (a ticket
    spent on a workload that stopped): its row says so."""
    action = _ACTION.get()
    if action is not None:
        action.status = status


async def settle(action: Action, status: int) -> None:
    """When `action`'s request answers `status`: write its row if no write did (the request
    failed, or changed nothing), or correct the row when the answer is not the one recorded.
    Logged, never raised: the answer goes out either way."""
    store = action.store
    if not action.armed or store is None or action.tenant_id is None:
        return
    action.armed = False  # nothing below, nor anything after, records it again
    try:
        if not action.recorded:
            action.status = status
            async with store.write_aside() as conn:
                await conn.execute(_INSERT_ACTIVITY, action.row())
        elif status != action.status and action.seq is not None:
            async with store.write_aside() as conn:
                await conn.execute(
                    sa.update(m.activity)
                    .where(m.activity.c.seq == action.seq)
                    .values(status=status, outcome=outcome_of(status))
                )
    except Exception as exc:
        log.warning(
            "activity not recorded",
            extra={"action": action.name, "status": status, "error": repr(exc)},
        )


def insert_ignore(
    conn: sa.Connection, table: sa.Table, values: Mapping[str, Any], *, keys: list[str]
) -> bool:
    """Insert a row unless one with the same `keys` exists; True when it was inserted.

    The conflict is resolved by the database (`ON CONFLICT DO NOTHING`), so a Postgres
    transaction is not aborted by a duplicate.
    """
    statement = _insert_ignoring(conn.dialect.name, table, tuple(keys))
    return statements.execute(conn, statement, values).rowcount == 1


def insert_all_ignoring(
    conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]], *, keys: list[str]
) -> None:
    """Insert each row (one statement for all: the driver's executemany) unless one with the
    same `keys` exists, as `insert_ignore` does for one. Rows must all name the same columns."""
    statements.execute(conn, _insert_ignoring(conn.dialect.name, table, tuple(keys)), rows)


@functools.cache
def _insert_ignoring(dialect_name: str, table: sa.Table, keys: tuple[str, ...]) -> Any:
    """One statement per table and keys (parameters apart), so it is compiled once."""
    dialect = sqlite if dialect_name == "sqlite" else postgresql
    return dialect.insert(table).on_conflict_do_nothing(index_elements=list(keys))
