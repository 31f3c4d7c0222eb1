"""The Starlette app: the declared operations, the edge middleware, /openapi.json, and JSON
errors for unknown routes (404) and wrong methods (405).

A path with a trailing slash is an unknown route, not a redirect: Starlette's redirect would
build its `Location` from the request's `Host` header, which the caller chooses.
"""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from einsora.api.context import ApiContext
from einsora.api.errors import ApiError, MethodNotAllowed, NotFound, error_response
from einsora.api.middleware import EdgeMiddleware
from einsora.api.openapi import openapi_document
from einsora.api.operation import routes as operation_routes
from einsora.api.routers import all_operations


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    request_id: str = request.scope["state"]["request_id"]
    error: ApiError
    if exc.status_code == 404:
        path = request.url.path
        hint = "; paths end without a slash" if len(path) > 1 and path.endswith("/") else ""
        error = NotFound(f"no route {path}{hint}")
    elif exc.status_code == 405:
        error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
        error.headers = dict(exc.headers or {})
    else:
        error = ApiError(exc.detail, code=f"http_{exc.status_code}")
        error.status = exc.status_code
    return error_response(error, request_id)


def create_app(ctx: ApiContext) -> Starlette:
    """The api's ASGI app over `ctx`."""
    operations = all_operations()
    document = json.dumps(openapi_document(operations)).encode()

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    routes = operation_routes(operations, ctx)
    routes.append(Route("/openapi.json", openapi, methods=["GET"]))
    app = Starlette(
        routes=routes,
        middleware=[Middleware(EdgeMiddleware, metrics=ctx.metrics)],
        exception_handlers={HTTPException: _http_error},
    )
    app.router.redirect_slashes = False
    return app
