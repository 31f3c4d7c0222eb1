"""The FastAPI app: the routers, the edge middleware, the exception handlers, /openapi.json.

Every failure answers the api's error body with the request ID. One handler takes what routes
and domain functions raise (`EinsoraError`, and the store's own errors) through
`errors.api_error_of`; FastAPI's `RequestValidationError` (a query, header or path parameter
that breaks its type) is the same 422 a body's is; Starlette's 404 and 405 are JSON, the 405
with `Allow` naming every method of the path. Anything else is answered 500 by the edge
(`middleware.py`), which is where the request ID lives. A path with a trailing slash is an
unknown route, not a redirect: Starlette's redirect would build its `Location` from the
request's `Host` header, which the caller chooses.

HEAD is answered wherever GET is, as Starlette's own routes do and FastAPI's do not: each GET
route has a twin for HEAD, after every other route and out of the document.

The document is FastAPI's, from the routes' parameters and models, plus the two things our own
dependencies imply and FastAPI cannot see: the request body `JsonBody` validates, and the bearer
and session schemes of the routes that depend on `Me` or `Launch`, and the models of the event
streams' events' data (`schemas/events.py`), which no response model names. No docs UI is
served. The dashboard's files are served at `/` (`dashboard.py`), out of the document.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from einsora.api.context import ApiContext
from einsora.api.dashboard import DashboardFiles
from einsora.api.deps import AUTHENTICATED, JsonBody
from einsora.api.errors import (
    ApiError,
    BadRequest,
    MethodNotAllowed,
    NotFound,
    api_error_of,
    error_response,
    unprocessable,
)
from einsora.api.middleware import EdgeMiddleware
from einsora.api.routers import ROUTERS
from einsora.api.schemas.common import as_details
from einsora.api.schemas.events import EVENT_DATA
from einsora.api.server_span import ServerSpanMiddleware
from einsora.common import telemetry
from einsora.common.errors import EinsoraError
from einsora.common.sites import DASHBOARD_COOKIE

TITLE = "Einsora API"
VERSION = "1"
REF = "#/components/schemas/{model}"


def _request_id(request: Request) -> str:
    value: str = request.scope["state"]["request_id"]
    return value


async def _on_error(request: Request, exc: Exception) -> Response:
    return error_response(api_error_of(exc), _request_id(request))


async def _on_invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    # FastAPI's locations start with where the value was (`query`, `header`, `path`); ours name
    # the parameter alone, as they name a body's field.
    errors = [{**e, "loc": tuple(e["loc"][1:])} for e in exc.errors()]
    bad_json = [e for e in errors if e["type"] == "json_invalid"]
    error: ApiError = unprocessable(as_details(errors))
    if bad_json:  # only a body FastAPI parsed itself; `JsonBody` answers its own
        reason = bad_json[0].get("ctx", {}).get("error", "not JSON")
        error = BadRequest(f"malformed JSON: {reason}", code="malformed_json")
    return error_response(error, _request_id(request))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: ApiError
    path = request.url.path
    if exc.status_code == 404:
        hint = "; paths end without a slash" if len(path) > 1 and path.endswith("/") else ""
        error = NotFound(f"no route {path}{hint}")
    elif exc.status_code == 405:
        error = MethodNotAllowed(f"{request.method} is not allowed on {path}")
        error.headers = {"Allow": ", ".join(_allowed(request.app, request.scope["path"]))}
    else:
        error = ApiError(str(exc.detail), code=f"http_{exc.status_code}")
        error.status = exc.status_code
    return error_response(error, _request_id(request))


def _allowed(app: FastAPI, path: str) -> list[str]:
    """Every method some route answers on `path` (a route answers one method, FastAPI's way)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.path_regex.match(path):
            methods |= route.methods or set()
    return sorted(methods)


class _Api(FastAPI):
    """FastAPI with the api's document (`_document`), made once and served as made."""

    _served: bytes | None = None

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = _document(self)
        return self.openapi_schema

    async def serve_openapi(self, request: Request) -> Response:
        if self._served is None:
            self._served = json.dumps(self.openapi()).encode()
        return Response(self._served, media_type="application/json")


def _app() -> FastAPI:
    app = _Api(
        title=TITLE,
        version=VERSION,
        # Served below, after every route, so no request tries its route before its own.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
        # The edge middleware counts and logs every request; FastAPI's own OpenTelemetry would
        # only add work to each one.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
        exception_handlers={
            EinsoraError: _on_error,
            SQLAlchemyError: _on_error,
            RequestValidationError: _on_invalid,
            HTTPException: _on_http_error,
        },
    )
    for router in ROUTERS:
        # The routers' own routes, as they are: FastAPI's `include_router` would add a layer
        # that matches every request a second time (some 10 us a request, measured).
        app.router.routes.extend(router.routes)
    for route in list(app.router.routes):
        if isinstance(route, APIRoute) and "GET" in (route.methods or ()):
            app.router.add_api_route(
                route.path,
                route.endpoint,
                methods=["HEAD"],
                name=route.name,
                status_code=route.status_code,
                response_model=None,
                include_in_schema=False,
            )
    app.add_route("/openapi.json", app.serve_openapi, methods=["GET"], include_in_schema=False)
    return app


def create_app(ctx: ApiContext) -> FastAPI:
    """The api's ASGI app over `ctx`."""
    app = _app()
    app.state.ctx = ctx  # the one thing on the app: routes reach every tool through it
    # The dashboard's pages and files, after every API route (ADR-0019).
    app.router.routes.extend(DashboardFiles.from_settings(ctx.settings).routes())
    app.add_middleware(EdgeMiddleware, metrics=ctx.metrics)
    if telemetry.ON:
        # Outside the edge, which names its request ID on the span. Not added while tracing is
        # off, so it costs nothing then.
        app.add_middleware(ServerSpanMiddleware)
    return app


def openapi_document() -> dict[str, Any]:
    """The document /openapi.json serves (describing the routes needs no ApiContext)."""
    return _app().openapi()


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def _document(app: FastAPI) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    bodies: dict[type[BaseModel], list[dict[str, Any]]] = {}
    for route in app.routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        calls = list(_calls(route.dependant))
        paths = document["paths"][route.path_format]
        operations = [paths[method.lower()] for method in route.methods or ()]
        for operation in operations:
            if any(call in AUTHENTICATED for call in calls):
                # An API token, or the dashboard's session cookie (ADR-0019).
                operation["security"] = [{"bearer": []}, {"session": []}]
        for call in calls:
            if isinstance(call, JsonBody):
                bodies.setdefault(call.model, []).extend(operations)
    refs, definitions = models_json_schema(
        [(model, "validation") for model in bodies], ref_template=REF
    )
    # The data of the event streams' events, which no route's response model names.
    _, streamed = models_json_schema(
        [(model, "serialization") for model in EVENT_DATA.values()], ref_template=REF
    )
    for model, operations in bodies.items():
        for operation in operations:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(model, "validation")]}},
            }
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name, schema in definitions.get("$defs", {}).items():
        if schemas.setdefault(name, schema) != schema:
            raise RuntimeError(f"two different schemas are named {name} in the document")
    for name, schema in streamed.get("$defs", {}).items():
        # Models the responses name already (PlacementOut) stay as FastAPI wrote them.
        schemas.setdefault(name, schema)
    components["schemas"] = dict(sorted(schemas.items()))
    components["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer"},
        "session": {
            "type": "apiKey",
            "in": "cookie",
            "name": DASHBOARD_COOKIE,
            "description": "the dashboard's session (POST /v1/sessions); a POST, PUT, PATCH or "
            "DELETE with it needs its `X-CSRF-Token` header as well",
        },
    }
    return document
