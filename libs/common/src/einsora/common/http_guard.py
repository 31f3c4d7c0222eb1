"""aiohttp servers whose failed requests are answered and logged without their bytes.

aiohttp answers a request it cannot parse (a bare LF, a control character, a line too long) with
a 400 whose body is the parser's message, and logs that message with a traceback at ERROR. The
message quotes the offending bytes, and those are the request itself: a site's `Cookie`, an
`Authorization` header with an API or gateway key, a `?ticket=` or `?token=`. So aiohttp's error
handling is replaced here, at its source, rather than filtered afterwards by a pattern that would
have to guess every shape a secret takes. A failed request is answered with a short fixed text
and a request ID, in the service's own shape (`Answer`), and logged as one line naming the
exception's type, never its message; a failure of our own code keeps its stack frames (file,
line, function), which quote no data. The access proxy and the gateway both serve through it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from einsora.common import logs
from einsora.common.ids import new_id

Answer = Callable[[int, str, str], web.StreamResponse]
"""The service's error answer: (status, text, request id) → response."""

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
        server: GuardedServer = self._manager  # type: ignore[assignment]
        request_id = new_id("request")
        if isinstance(exc, HttpProcessingError):
            status = 400  # also an unreadable body, which surfaces in the handler as a 500
        with logs.bind(request_id=request_id):
            if status < 500:
                server.log.info("unreadable request refused (%s, HTTP %d)", _kind(exc), status)
            else:
                server.log.error(
                    "request failed (%s, HTTP %d)\n%s", _kind(exc), status, _frames(exc)
                )
        if request.writer.output_size > 0:
            # Part of an answer is out: a second one would corrupt the stream (as aiohttp does).
            raise ConnectionError("a response was already started; the connection is closed")
        default = "Bad request." if status < 500 else f"The {server.what} failed on this request."
        response = server.answer(status, _ANSWERS.get(status, default), request_id)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        error = exc if isinstance(exc, BaseException) else None
        server: GuardedServer = self._manager  # type: ignore[assignment]
        server.log.error("connection failed (%s)\n%s", _kind(error), _frames(error))

    def log_debug(self, *args: Any, **kw: Any) -> None:
        kw.pop("exc_info", None)  # aiohttp's own fixed text stays; a traceback's message goes
        super().log_debug(*args, **kw)


class GuardedServer(web.Server):
    """aiohttp's low-level server, whose connections are GuardedRequestHandlers."""

    answer: Answer
    what: str
    log: logging.Logger

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """An AppRunner whose server is a GuardedServer, with the same handler and options.

    `answer` shapes the service's error answers, `what` names the service in them ("access
    proxy"), and `logger` is where its failed requests are logged.
    """

    def __init__(
        self, app: web.Application, *, answer: Answer, what: str, logger: str, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self._answer = answer
        self._what = what
        self._log = logging.getLogger(logger)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        server = GuardedServer(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
        server.answer, server.what, server.log = self._answer, self._what, self._log
        return server
