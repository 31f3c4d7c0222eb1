"""The api's HTTP/1.1 connections: uvicorn's protocols, with every request's head bounded in
size and in time, and the api's JSON answer to bytes that are not HTTP at all.

uvicorn reads a head (the request line and headers) for as long and as large as the client
sends it: httptools (llhttp) has no limit of its own, and neither parser has a deadline. Eight
connections each sending 64 MiB of headers raised the api's memory by 512 MiB, and a head sent
a byte at a time (slowloris) held its connection for ever. So each head's bytes are counted as
they are read, before the parser sees them: at `MAX_HEAD_BYTES` without its end, the request is
answered 431 and the connection closed, the parser having held no more than that. A head must
also be whole within `header_timeout_s` of its first byte (or of the connection's opening):
else it is answered 408 and closed, and a connection that sent nothing is closed without a word,
as an idle one is. These answers come before any route, so they carry a new request ID, and
never a byte of what was sent. The time a request's body or its answer takes is not the head's.

What a parser refuses (a negative Content-Length, a malformed header, a body framed twice) is
answered with the api's JSON error and a request ID instead of uvicorn's plain text.
"""

from __future__ import annotations

import asyncio
import http
import logging
from typing import cast

import h11

try:
    import httptools
except ImportError:  # the api's dependency, but uvicorn runs without it too
    httptools = None  # type: ignore[assignment]
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from einsora.api.errors import ApiError, BadRequest, error_body
from einsora.common import logs
from einsora.common.ids import new_id

log = logging.getLogger("einsora.api.access")

MAX_HEAD_BYTES = 32 * 1024
"""The largest head read: the request line and every header together. Twice what Node and h11
allow by default; a browser's cookies for the api's host (other apps' on `localhost` too) fit."""

DEFAULT_HEADER_TIMEOUT_S = 10.0

FRAMED_TWICE = "the body is framed twice (Content-Length and Transfer-Encoding); send one"


class HeadersTooLarge(ApiError):
    """A head (request line and headers) over `MAX_HEAD_BYTES`; the connection is closed."""

    status = 431
    code = "headers_too_large"


class HeaderTimeout(ApiError):
    """A head that did not arrive whole in time; the connection is closed."""

    status = 408
    code = "header_timeout"


def refusal(error: ApiError) -> tuple[str, bytes, list[tuple[bytes, bytes]]]:
    """The api's answer to a connection it closes before any route: a new request ID, a JSON
    body, headers. Logged with the request ID, never with what was sent."""
    request_id = new_id("request")
    body = error_body(error, request_id)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-request-id", request_id.encode()),
        (b"x-content-type-options", b"nosniff"),
    ]
    with logs.bind(request_id=request_id):
        log.info("request refused: %s", error.code, extra={"status": error.status})
    return request_id, body, headers


def raw_answer(error: ApiError) -> bytes:
    """`refusal(error)` as the bytes of an HTTP/1.1 answer."""
    _, body, headers = refusal(error)
    phrase = http.HTTPStatus(error.status).phrase
    head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return f"HTTP/1.1 {error.status} {phrase}\r\n".encode() + head + b"\r\n" + body


def _malformed(*, framed_twice: bool = False) -> BadRequest:
    if framed_twice:
        return BadRequest(FRAMED_TWICE, code="ambiguous_framing")
    return BadRequest(
        "malformed HTTP request: its request line, a header or the body's framing is not "
        "valid HTTP/1.1 (a Content-Length that is not a number of bytes, say)",
        code="malformed_request",
    )


class _HeadGuard:
    """Counts and times each head as its bytes are read (see the module's docstring).

    A protocol mixes it in before uvicorn's own, calls `_guard_open`/`_guard_close` from
    `connection_made`/`connection_lost` and `_head_read` once a head is parsed, and says with
    `_reading_head` whether the bytes now coming are a head's and with `_answering` whether an
    answer is under way (which a refusal must not cut into).
    """

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _head_bytes = 0
    _head_timer: asyncio.TimerHandle | None = None

    def _feed(self, data: bytes) -> None:
        raise NotImplementedError

    def _reading_head(self) -> bool:
        raise NotImplementedError

    def _answering(self) -> bool:
        raise NotImplementedError

    def _guard_open(self) -> None:
        self._head_bytes = 0
        self._arm()

    def _guard_close(self) -> None:
        self._disarm()

    def _head_read(self) -> None:
        """A head was parsed whole: its time and its count stop; the next one's start at 0."""
        self._disarm()
        self._head_bytes = 0

    def _guarded_feed(self, data: bytes) -> None:
        if not self._reading_head():
            self._feed(data)  # a body: the edge middleware bounds it
            return
        if self._head_timer is None:
            self._arm()
        room = MAX_HEAD_BYTES - self._head_bytes
        self._head_bytes += min(len(data), room)
        self._feed(data[:room])
        if self.transport.is_closing():
            return  # refused by the parser
        if self._reading_head() and self._head_bytes >= MAX_HEAD_BYTES:
            self._refuse(
                HeadersTooLarge(
                    f"the request's head (request line and headers) is over the limit of "
                    f"{MAX_HEAD_BYTES} bytes"
                )
            )
        elif len(data) > room:
            self._feed(data[room:])  # the head ended within the limit: a body, or the next

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._reading_head():
            return
        if self._head_bytes == 0:
            self.transport.close()  # nothing came: an idle connection, closed as such
            return
        self._refuse(
            HeaderTimeout(
                f"the request's head did not arrive whole within {self.header_timeout_s:g} s"
            )
        )

    def _refuse(self, error: ApiError) -> None:
        self._disarm()
        if not self._answering():  # else the answer under way would be cut into
            self.transport.write(raw_answer(error))
        self.transport.close()


class EdgeH11Protocol(_HeadGuard, H11Protocol):
    """uvicorn's HTTP/1.1 protocol on h11 with the head guard, answering what h11 cannot parse
    with the api's JSON error and a request ID instead of plain text."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._guard_open()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard_close()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._guarded_feed(data)

    def _feed(self, data: bytes) -> None:
        was_head = self._reading_head()
        super().data_received(data)
        if was_head and not self._reading_head():
            self._head_read()

    def _reading_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def send_400_response(self, msg: str) -> None:
        _, body, headers = refusal(_malformed())
        try:
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:
            pass  # a response was under way already: closing is all that is left
        self.transport.close()


class EdgeHttpToolsProtocol(_HeadGuard, HttpToolsProtocol):
    """The same on httptools (llhttp), the faster parser uvicorn uses where it is installed.

    llhttp refuses a body framed twice itself (h11 lets it through to `EdgeMiddleware`), so
    `_feed` keeps the parser's reason to give the same answer either way.
    """

    _framed_twice = False
    _in_head = True

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._guard_open()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard_close()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._guarded_feed(data)

    def _feed(self, data: bytes) -> None:
        # uvicorn's own `data_received` (0.32+), but for keeping the parser's reason.
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            reason = str(exc)
            self._framed_twice = "Transfer-Encoding" in reason and "Content-Length" in reason
            self.send_400_response(reason)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_read()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # what comes next is the next request's head

    def _reading_head(self) -> bool:
        return self._in_head

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def send_400_response(self, msg: str) -> None:
        self.transport.write(raw_answer(_malformed(framed_twice=self._framed_twice)))
        self.transport.close()


def edge_protocol(
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
) -> type[EdgeH11Protocol] | type[EdgeHttpToolsProtocol]:
    """httptools where installed (issue 11: its parser costs less per request), else h11; each
    head must arrive whole within `header_timeout_s`."""
    base: type[EdgeH11Protocol] | type[EdgeHttpToolsProtocol] = (
        EdgeHttpToolsProtocol if httptools is not None else EdgeH11Protocol
    )
    timed = type(base.__name__, (base,), {"header_timeout_s": header_timeout_s})
    return cast("type[EdgeH11Protocol] | type[EdgeHttpToolsProtocol]", timed)
