"""Following one of the api's event streams (server-sent events) from the CLI.

`follow(base_url, token, path)` is a generator of the stream's events: a `snapshot` first, then
each `workload` change. When the connection drops (the api restarts, a proxy cuts it, nothing,
not even a heartbeat, arrives for `read_timeout_s`), it connects again with `Last-Event-ID`, after
a short back-off that grows while the api cannot be reached, and yields each event once: what
came before the drop is not yielded again, and nothing after it is missed (the api's part of
the bargain, `services/api/src/einsora/api/streams.py`).

It is the standard library's HTTP, as the rest of the CLI's client (`client.py`): a CLI command
that follows a stream starts no event loop and imports no server library. A refusal (401, 404,
422, 429: more open streams than the token may hold) is ApiRefused at once; an api that cannot
be reached for `give_up_s` is ApiUnreachable.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from einsora.cli.client import ApiRefused, ApiUnreachable, refusal

RETRYABLE_STATUSES = frozenset({502, 503, 504})
"""An api shutting down or a proxy without an api behind it: worth connecting again."""


@dataclass(frozen=True)
class StreamEvent:
    """One event of a stream: its `id`, its name (`snapshot`, `workload`; `message` when the
    server named none) and its data, parsed as JSON (the text itself when it is not JSON)."""

    id: str | None
    name: str
    data: Any


class SseParser:
    """The SSE wire format (WHATWG's "event stream interpretation"), one line at a time.

    `last_event_id` follows every `id:` field, a frame without data included (the api sends
    such a frame to move the id past a change its snapshot already showed); `retry_ms` is the
    server's reconnection delay, when it sent one.
    """

    def __init__(self, last_event_id: str | None = None) -> None:
        self.last_event_id = last_event_id
        self.retry_ms: int | None = None
        self._id = last_event_id
        """The id buffer: it becomes `last_event_id` only when its frame is complete."""
        self._name = ""
        self._data: list[str] = []

    def feed(self, line: str) -> StreamEvent | None:
        """Take one line (without its line ending); the event it completes, if any."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: the api's heartbeat
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._name = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> StreamEvent | None:
        self.last_event_id = self._id  # a frame with an id and no data moves it too
        name, data = self._name or "message", self._data
        self._name, self._data = "", []
        if not data:
            return None
        text = "\n".join(data)
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = text
        return StreamEvent(self.last_event_id, name, parsed)

    def reset(self) -> None:
        """Forget a half-read frame (the connection dropped in the middle of it): a resume
        asks for it again."""
        self._id, self._name, self._data = self.last_event_id, "", []


SNAPSHOT = "snapshot"
"""The name of a stream's first event (and of a fresh start after a lost resume point): the
current state of what it follows. Each change after it is a `workload` event."""


def workload_events_path(workload_id: str) -> str:
    """The stream of one workload's changes."""
    return f"/v1/workloads/{quote(workload_id, safe='')}/events?follow=true"


TENANT_EVENTS_PATH = "/v1/events"
"""The stream of every change to the tenant's workloads."""


def follow(
    base_url: str,
    token: str | None,
    path: str,
    *,
    last_event_id: str | None = None,
    read_timeout_s: float = 60.0,
    backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
    give_up_s: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[StreamEvent]:
    """Each event of the stream at `path`, once, across dropped connections (see the module).

    `read_timeout_s` is the silence after which a connection counts as dropped: longer than
    the api's heartbeat (15 s). Closing the generator closes the connection.
    """
    url = base_url.rstrip("/") + path
    parser = SseParser(last_event_id)
    delay = backoff_s
    unreachable_since: float | None = None
    connected = False
    while True:
        try:
            # Once connected, a 429 is most likely the dropped stream the api has not yet
            # seen go: it frees its place within moments.
            response = _open(url, token, parser.last_event_id, read_timeout_s, retry_429=connected)
        except _Retry as retry:
            now = time.monotonic()
            unreachable_since = unreachable_since or now
            if now - unreachable_since >= give_up_s:
                raise ApiUnreachable(
                    f"lost the event stream of the Einsora API at {base_url} ({retry.reason}) "
                    f"and could not get it back within {give_up_s:g} s; is it running?"
                ) from None
            sleep(delay)
            delay = min(delay * 2, max_backoff_s)
            continue
        connected = True
        unreachable_since = None
        delay = backoff_s
        try:
            yield from _events(response, parser)
        finally:
            response.close()
        parser.reset()
        # The stream ended or dropped: again after the server's delay (bounded), or ours.
        sleep(min(parser.retry_ms / 1000, max_backoff_s) if parser.retry_ms else backoff_s)


class _Retry(Exception):
    """The stream could not be opened now; connecting again may help."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _open(
    url: str,
    token: str | None,
    last_event_id: str | None,
    read_timeout_s: float,
    *,
    retry_429: bool,
) -> http.client.HTTPResponse:
    req = urllib.request.Request(url, method="GET")  # noqa: S310 (the api's http(s) URL)
    req.add_header("Accept", "text/event-stream")
    req.add_header("Cache-Control", "no-cache")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if last_event_id:
        req.add_header("Last-Event-ID", last_event_id)
    try:
        response: http.client.HTTPResponse = urllib.request.urlopen(  # noqa: S310
            req, timeout=read_timeout_s
        )
    except urllib.error.HTTPError as exc:
        if exc.code in RETRYABLE_STATUSES or (retry_429 and exc.code == 429):
            exc.close()
            raise _Retry(f"HTTP {exc.code}") from None
        raise refusal(exc) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _Retry(str(getattr(exc, "reason", exc))) from None
    content_type = response.headers.get("Content-Type", "")
    if not content_type.startswith("text/event-stream"):
        response.close()
        raise ApiRefused(
            response.status,
            "not_an_event_stream",
            f"{url} answered {content_type or 'no content type'}, not an event stream",
            response.headers.get("X-Request-ID"),
        )
    return response


def _events(response: http.client.HTTPResponse, parser: SseParser) -> Iterator[StreamEvent]:
    """The events of one connection, until it ends or drops; each yielded once."""
    sent = parser.last_event_id
    while True:
        try:
            raw = response.readline()
        except (OSError, http.client.HTTPException):
            return  # dropped (a read timeout is an OSError too): the caller connects again
        if not raw:
            return
        event = parser.feed(raw.decode("utf-8", "replace").rstrip("\r\n"))
        if event is None:
            continue
        if _not_after(event.id, sent):
            continue  # a server that repeats itself: yielded already
        sent = event.id
        yield event


def _not_after(event_id: str | None, last: str | None) -> bool:
    """Whether `event_id` is one already seen: the api's ids are increasing sequences."""
    if event_id is None or last is None or event_id == "" or last == "":
        return False
    if event_id.isdigit() and last.isdigit():
        return int(event_id) <= int(last)
    return False
