"""Error answers in OpenAI's shape, so the `openai` SDK (and every client built like it) reads them.

The body is `{"error": {"message", "type", "param", "code"}, "request_id"}`: the `error` object
is exactly OpenAI's, and the request ID sits beside it (as in the `X-Request-ID` header) for a
person to quote when asking what happened.
"""

from __future__ import annotations

import json

from aiohttp import web

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"


def error_response(
    status: int,
    message: str,
    request_id: str,
    *,
    code: str | None,
    type_: str = INVALID_REQUEST,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-shaped error with `X-Request-ID`; never cached."""
    body = {
        "error": {"message": message, "type": type_, "param": param, "code": code},
        "request_id": request_id,
    }
    all_headers = {"X-Request-ID": request_id, "Cache-Control": "no-store"}
    if headers:
        all_headers.update(headers)
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=all_headers,
    )


def invalid_key(request_id: str) -> web.Response:
    # One answer for a missing, unknown, revoked or expired key: which one is not for a
    # stranger to learn.
    return error_response(
        401,
        "Incorrect or missing API key: send `Authorization: Bearer esk_…` with a live gateway "
        "key (create one with `einsora keys create`).",
        request_id,
        code="invalid_api_key",
        type_=AUTHENTICATION,
    )


def model_not_found(model: str, request_id: str) -> web.Response:
    shown = model if len(model) <= 200 else model[:200] + "…"
    return error_response(
        404,
        f"The model `{shown}` does not exist, is not running, or this key may not use it; "
        "GET /v1/models lists the ones it may.",
        request_id,
        code="model_not_found",
        param="model",
    )


def bad_request(message: str, request_id: str, *, param: str | None = None) -> web.Response:
    return error_response(400, message, request_id, code="invalid_request", param=param)
