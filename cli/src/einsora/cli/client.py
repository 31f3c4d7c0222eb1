"""A small synchronous client of Einsora's REST API, for the CLI.

It knows only HTTP and the API's error body (`{"error", "message", "request_id"}`): a refusal
becomes ApiRefused (exit code 1, with the API's message and request ID), a connection that cannot
be made becomes ApiUnreachable (exit code 3, naming the URL tried). The standard library is
enough for a CLI that makes one request at a time.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from einsora.common.errors import EinsoraError

if TYPE_CHECKING:
    from einsora.cli.follow import StreamEvent


class ApiRefused(EinsoraError):
    """The API answered with an error status."""

    code = "api_refused"

    def __init__(self, status: int, error: str, message: str, request_id: str | None):
        super().__init__(message, code=error)
        self.status = status
        self.error = error
        self.request_id = request_id


class ApiUnreachable(EinsoraError):
    """No HTTP answer from the API URL."""

    code = "api_unreachable"
    retryable = True


class ApiClient:
    """JSON over HTTP with a bearer token."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        url = self.base_url + path
        if query:
            clean = {k: v for k, v in query.items() if v is not None}
            if clean:
                url += "?" + urllib.parse.urlencode(clean)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (http only)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise refusal(exc) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiUnreachable(
                f"cannot reach the Einsora API at {self.base_url} ({reason}); is it running? "
                "Set --api or EINSORA_API to its URL."
            ) from None
        return json.loads(raw) if raw else None

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, body if body is not None else {}, headers=headers)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def events(self, path: str, *, last_event_id: str | None = None) -> Iterator[StreamEvent]:
        """Each event of the api's event stream at `path`, once, across dropped connections."""
        from einsora.cli.follow import follow  # it imports this module

        return follow(self.base_url, self._token, path, last_event_id=last_event_id)

    def paginate(self, path: str, **query: Any) -> list[Any]:
        """Every item of a cursor-paginated list."""
        items: list[Any] = []
        cursor = None
        while True:
            page = self.get(path, **query, cursor=cursor)
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return items


def refusal(exc: urllib.error.HTTPError) -> ApiRefused:
    """The api's refusal (its error body, or the status alone), the response closed."""
    request_id = exc.headers.get("X-Request-ID")
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = {}
    finally:
        exc.close()
    if not isinstance(body, dict):
        body = {}
    return ApiRefused(
        exc.code,
        str(body.get("error", f"http_{exc.code}")),
        str(body.get("message", exc.reason)),
        body.get("request_id") or request_id,
    )
