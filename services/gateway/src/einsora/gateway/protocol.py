"""The gateway's HTTP connections: a request that fails is answered in OpenAI's shape and logged
without its bytes.

aiohttp answers a request it cannot parse with a text whose body quotes the parser's message,
and logs that message with a traceback. The message quotes the request itself, and a gateway
request carries an `esk_…` key in its `Authorization` header. So, as in the access proxy,
aiohttp's error handling is replaced at its source: the answer is a short fixed text in OpenAI's
error shape with a request ID, and the log line names the exception's type, never its message.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from einsora.common import logs
from einsora.common.ids import new_id
from einsora.gateway.errors import INVALID_REQUEST, SERVER, error_response

log = logging.getLogger("einsora.gateway.http")

_ANSWERS = {
    400: "Bad request: it could not be read as HTTP/1.1.",
    504: "The request took too long.",
}


def _kind(exc: BaseException | None) -> str:
    return "-" if exc is None else exc.__class__.__name__


def _frames(exc: BaseException | None) -> str:
    """Where it failed, frame by frame: source lines, never the values or the message."""
    if exc is None or exc.__traceback__ is None:
        return ""
    return "".join(traceback.format_tb(exc.__traceback__)).rstrip()


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection handler, with error answers and log lines that quote no request."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # `message` and `exc` carry the request's bytes: neither is logged or answered.
        request_id = new_id("request")
        if isinstance(exc, HttpProcessingError):
            status = 400
        with logs.bind(request_id=request_id):
            if status < 500:
                log.info("unreadable request refused (%s, HTTP %d)", _kind(exc), status)
            else:
                log.error("request failed (%s, HTTP %d)\n%s", _kind(exc), status, _frames(exc))
        if request.writer.output_size > 0:
            # Part of an answer is out: a second one would corrupt the stream.
            raise ConnectionError("a response was already started; the connection is closed")
        default = "Bad request." if status < 500 else "The gateway failed on this request."
        response = error_response(
            status,
            _ANSWERS.get(status, default),
            request_id,
            code=None,
            type_=INVALID_REQUEST if status < 500 else SERVER,
        )
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        error = exc if isinstance(exc, BaseException) else None
        log.error("connection failed (%s)\n%s", _kind(error), _frames(error))

    def log_debug(self, *args: Any, **kw: Any) -> None:
        kw.pop("exc_info", None)
        super().log_debug(*args, **kw)


class GuardedServer(web.Server):
    """aiohttp's low-level server, whose connections are GuardedRequestHandlers."""

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """An AppRunner whose server is a GuardedServer, with the same handler and options."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return GuardedServer(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
