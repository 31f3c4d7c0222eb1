"""The one list of transient failures (issue 35, F2): what a loop talking to the bus or the store
retries, and what it must not (a retry would hide a bug, or spin for ever)."""

from __future__ import annotations

import asyncio
import sqlite3

import asyncpg.exceptions
import nats.errors
import nats.js.errors
import pytest
import sqlalchemy.exc

from einsora.common.bus import names
from einsora.common.testing import Bus
from einsora.common.transient import is_bus_transient, is_store_transient, is_transient


def _wrapped(orig: Exception) -> BaseException:
    """As SQLAlchemy hands a driver's error to its caller."""
    return sqlalchemy.exc.DBAPIError.instance("SELECT 1", {}, orig, Exception)


@pytest.mark.parametrize(
    "error",
    [
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
        nats.errors.ConnectionClosedError(),
        nats.errors.ConnectionReconnectingError(),
        nats.errors.StaleConnectionError(),
        nats.errors.UnexpectedEOF(),
        nats.errors.NoServersError(),
        nats.errors.FlushTimeoutError(),
        nats.js.errors.NoStreamResponseError(),
        nats.js.errors.FetchTimeoutError(),
        nats.js.errors.ServiceUnavailableError(code=503),
        nats.js.errors.ServerError(code=500),
        nats.js.errors.APIError(code=503, err_code=10008),
        nats.js.errors.APIError(code=400, err_code=10164),  # a conditional write in flight
        TimeoutError(),
        ConnectionRefusedError(),
        ConnectionResetError(),
        OSError(113, "No route to host"),
        sqlalchemy.exc.OperationalError("x", {}, sqlite3.OperationalError("database is locked")),
        sqlalchemy.exc.InterfaceError("x", {}, Exception("connection is closed")),
        sqlalchemy.exc.TimeoutError(),
        _wrapped(asyncpg.exceptions.SerializationError("could not serialize")),
        _wrapped(asyncpg.exceptions.DeadlockDetectedError("deadlock")),
        _wrapped(asyncpg.exceptions.AdminShutdownError("terminating connection")),
        _wrapped(asyncpg.exceptions.LockNotAvailableError("lock timeout")),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        sqlite3.OperationalError("database is locked"),
    ],
    ids=repr,
)
def test_what_a_retry_can_cure_is_transient(error: BaseException) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        nats.errors.BadSubjectError(),
        nats.errors.AuthorizationError(),
        nats.errors.MaxPayloadError(),
        nats.js.errors.KeyWrongLastSequenceError("wrong last sequence: 3"),
        nats.js.errors.APIError(code=400, err_code=10071),  # a compare-and-set that lost
        nats.js.errors.KeyNotFoundError(),
        nats.js.errors.NotFoundError(code=404, err_code=10059),
        nats.js.errors.BadRequestError(code=400),
        sqlalchemy.exc.IntegrityError("x", {}, Exception("duplicate key")),
        _wrapped(asyncpg.exceptions.UniqueViolationError("duplicate key")),
        sqlalchemy.exc.ProgrammingError("x", {}, Exception("syntax error")),
        FileNotFoundError(),
        PermissionError(),
        ValueError(),
        KeyError("x"),
        asyncio.CancelledError(),
    ],
    ids=repr,
)
def test_an_answer_or_a_bug_is_not_transient(error: BaseException) -> None:
    assert not is_transient(error)


def test_the_two_halves_of_the_list() -> None:
    assert is_bus_transient(nats.errors.NoRespondersError())
    assert not is_store_transient(nats.errors.NoRespondersError())
    store_error = sqlalchemy.exc.OperationalError("x", {}, Exception("server closed"))
    assert is_store_transient(store_error)
    assert not is_bus_transient(store_error)


async def test_a_real_bucket_away_answers_a_transient_error(bus: Bus) -> None:
    """What a standby met when the lease's bucket was gone (a direct get nobody answers)."""
    with pytest.raises(nats.errors.NoRespondersError) as raised:
        await bus.js.get_msg("KV_no_such_bucket", subject="$KV.no_such_bucket.k", direct=True)
    assert is_transient(raised.value), repr(raised.value)
    with pytest.raises(nats.js.errors.NotFoundError) as missing:
        await bus.js.get_msg(
            names.MACHINES.stream, subject=names.MACHINES.key_subject("no.such.key"), direct=True
        )
    assert not is_transient(missing.value), repr(missing.value)
