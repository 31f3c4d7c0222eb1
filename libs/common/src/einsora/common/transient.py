"""Which failures are transient: the bus's and the store's, in one list (issue 35, F2).

A loop that talks to NATS or to the store must outlive every failure that trying again can
cure: a NATS node restarting, a clustered stream electing its leader (no responders, no stream
response, a timeout, a 503), a connection being replaced, the database restarting or failing
over, a serialisation failure or a deadlock. Before this module each loop spelled its own
tuple (nine spellings), and a standby scheduler died of the one its tuple forgot. Every loop
asks `is_transient(exc)` instead:

    try:
        await step()
    except Exception as exc:
        if not is_transient(exc):
            raise
        log.warning("…; retrying", extra={"error": repr(exc)})

What is never transient, so a loop that retries it would hide a bug or spin for ever: a refused
permission or credential, a bad subject, header or payload, a conflict that is an answer (a
compare-and-set that lost, a duplicate key, a missing key), and cancellation.

It never imports a store library (the agent installs without SQLAlchemy, and import-linter
says so): the store's failures are recognised by their classes' modules and names, and by the
SQLSTATE Postgres gives them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats.errors
import nats.js.errors

_BUS: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,  # FlushTimeoutError, DrainTimeoutError, FetchTimeoutError
    nats.errors.NoRespondersError,
    nats.errors.StaleConnectionError,  # UnexpectedEOF
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.SlowConsumerError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    nats.js.errors.TooManyStalledMsgsError,
    nats.js.errors.ConsumerSequenceMismatchError,
)
"""The bus's failures that a retry can cure (their subclasses too)."""

_API_CODES = frozenset({408, 500, 503, 504})
"""JetStream API answers that mean "not now" (a cluster without a leader for the stream yet,
a request that timed out on the server), not "no"."""

_API_ERR_CODES = frozenset({10164})
"""JetStream errors that decide nothing: 10164, a clustered stream's answer to a conditional
write (an expected last sequence) while another conditional write to that subject is still in
flight, or was applied a moment ago and not yet cleared; the same write may land next time."""

_NOT_TRANSIENT_OS: tuple[type[OSError], ...] = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)
"""OSErrors of files, not of connections: no retry cures them."""

_STORE_NAMES = frozenset(
    {
        # sqlalchemy.exc: the connection failed or was lost, or the pool had none to give
        ("sqlalchemy.exc", "OperationalError"),
        ("sqlalchemy.exc", "InterfaceError"),
        ("sqlalchemy.exc", "DisconnectionError"),
        ("sqlalchemy.exc", "TimeoutError"),
        # the drivers', when they reach a loop unwrapped
        ("sqlite3", "OperationalError"),  # "database is locked"
        ("asyncpg.exceptions._base", "InterfaceError"),
        ("asyncpg.exceptions", "ConnectionDoesNotExistError"),
        ("asyncpg.exceptions", "ConnectionFailureError"),
        ("asyncpg.exceptions", "CannotConnectNowError"),
        ("asyncpg.exceptions", "TooManyConnectionsError"),
        ("asyncpg.exceptions", "SerializationError"),
        ("asyncpg.exceptions", "DeadlockDetectedError"),
        ("asyncpg.exceptions", "AdminShutdownError"),
        ("asyncpg.exceptions", "CrashShutdownError"),
    }
)
"""(module, class) of the store's failures that a retry can cure (their subclasses too)."""

_SQLSTATE_CLASSES = ("08", "53", "57P", "40001", "40P01", "55P03")
"""Postgres SQLSTATEs (by prefix) of transient failures: a connection exception, insufficient
resources, an operator intervention (shutdown, restart), a serialisation failure, a deadlock, a
lock not available."""


def is_transient(exc: BaseException) -> bool:
    """True when trying again later can succeed: a failure of the bus or of the store that
    says "not now" rather than "no". Cancellation is never transient."""
    return is_bus_transient(exc) or is_store_transient(exc)


def is_bus_transient(exc: BaseException) -> bool:
    """A NATS or JetStream failure that a retry can cure, or a lost or refused connection."""
    if isinstance(exc, asyncio.CancelledError):
        return False
    if isinstance(exc, _BUS):
        return True
    if isinstance(exc, nats.js.errors.APIError):
        return (
            getattr(exc, "code", None) in _API_CODES  # some subclasses never set it
            or getattr(exc, "err_code", None) in _API_ERR_CODES
        )
    if isinstance(exc, nats.errors.Error):
        return False  # a refused permission, a bad subject, header or payload
    if isinstance(exc, OSError):  # TimeoutError and ConnectionError among them
        return not isinstance(exc, _NOT_TRANSIENT_OS)
    return False


def is_store_transient(exc: BaseException) -> bool:
    """A store failure that a retry can cure: the database away, restarting, out of
    connections, or a transaction that lost a serialisation race or a deadlock."""
    for error in _chain(exc):
        if any((c.__module__, c.__name__) in _STORE_NAMES for c in type(error).__mro__):
            return True
        sqlstate = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate.startswith(_SQLSTATE_CLASSES):
            return True
        if getattr(error, "connection_invalidated", False) is True:
            return True  # SQLAlchemy's DBAPIError for a connection it found dead
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The error, the driver's error SQLAlchemy wraps (`orig`), and their causes."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 8:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        for nxt in (getattr(error, "orig", None), error.__cause__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
