"""The api's errors: each carries a code, a message a person can act on, and its HTTP status.

Routes and domain functions raise these; `api_error_of` decides what any failure answers (the
store's errors included) and `error_response` turns it into
`{"error", "message", "request_id", "details"}` with the status; the app's one exception handler
uses both (`app.py`). Nothing a client sends may end as a 500: input is refused with one of
these instead.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from starlette.responses import Response

from einsora.common.errors import EinsoraError

log = logging.getLogger("einsora.api.http")


class ApiError(EinsoraError):
    """An error the api answers with `status`; `details` lists what was wrong, field by field."""

    status: int = 500
    code = "internal"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.details = details or []
        self.headers = headers or {}


class BadRequest(ApiError):
    """The request cannot be read at all (malformed JSON)."""

    status = 400
    code = "bad_request"


class Unauthenticated(ApiError):
    """No valid API token: missing, unknown, revoked or expired."""

    status = 401
    code = "unauthenticated"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ApiError):
    """The caller may see the object but not do this to it (e.g. a member adding members)."""

    status = 403
    code = "forbidden"


class NotFound(ApiError):
    """No such object for this tenant; another tenant's objects answer this too, never 403."""

    status = 404
    code = "not_found"


class MethodNotAllowed(ApiError):
    status = 405
    code = "method_not_allowed"


class Conflict(ApiError):
    """The object's state forbids the action (resume a running workload), or a name is taken."""

    status = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    """The body is over the limit, declared or as it streams; the connection is closed after."""

    status = 413
    code = "payload_too_large"

    def __init__(self, message: str) -> None:
        # Closed, so the rest of a body that is not read is never read either.
        super().__init__(message, headers={"Connection": "close"})


class Unprocessable(ApiError):
    """The body or query is valid JSON but breaks the schema; `details` names each field."""

    status = 422
    code = "validation_error"


class RateLimited(ApiError):
    """An API token is over one of its rate limits; `Retry-After` says when to try again."""

    status = 429
    code = "rate_limited"
    retryable = True


class Unavailable(ApiError):
    """A dependency (store, bus) cannot answer now; retrying later can help."""

    status = 503
    code = "unavailable"
    retryable = True


MAX_DETAILS_IN_MESSAGE = 3


def unprocessable(details: list[dict[str, Any]]) -> Unprocessable:
    """A 422 whose message names the first few fields of `details`."""
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:MAX_DETAILS_IN_MESSAGE])
    if len(details) > MAX_DETAILS_IN_MESSAGE:
        summary += f"; and {len(details) - MAX_DETAILS_IN_MESSAGE} more"
    return Unprocessable(summary, details=details)


def field_error(field: str, message: str, kind: str = "value_error") -> Unprocessable:
    """A 422 about one field, named in the message and in `details`."""
    return Unprocessable(
        f"{field}: {message}", details=[{"field": field, "message": message, "type": kind}]
    )


def error_body(error: ApiError, request_id: str) -> bytes:
    """`{"error", "message", "request_id", "details"}` as JSON."""
    return json.dumps(
        {
            "error": error.code,
            "message": error.message,
            "request_id": request_id,
            "details": error.details,
        },
        default=str,
    ).encode()


def api_error_of(exc: Exception) -> ApiError:
    """What a request that raised `exc` answers: an ApiError as it is, a store error as a
    conflict (409), a refused value (422) or unavailable (503), a retryable EinsoraError as
    unavailable; anything else is logged and answered as an internal error (500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, IntegrityError):
        log.info("conflicting write refused", extra={"error": str(exc.orig)})
        return Conflict("this conflicts with an existing object")
    if isinstance(exc, DataError):
        log.warning("value refused by the store", extra={"error": str(exc.orig)})
        return Unprocessable("a value could not be stored")
    if isinstance(exc, SQLAlchemyError):  # DBAPIError and the pool's own errors
        log.warning("store unavailable", extra={"error": repr(exc)})
        return Unavailable("the store did not answer; retry shortly")
    if isinstance(exc, EinsoraError) and exc.retryable:
        return Unavailable(exc.message)
    log.error("request failed", exc_info=exc)
    return ApiError("internal error; quote the request ID")


def error_response(error: ApiError, request_id: str) -> Response:
    return Response(
        error_body(error, request_id),
        status_code=error.status,
        headers=error.headers,
        media_type="application/json",
    )
