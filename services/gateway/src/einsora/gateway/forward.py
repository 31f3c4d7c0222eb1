"""Sending a request to a model's replicas, with failover, and passing the answer back.

Replicas are tried in the balancer's order, at most three. A replica that refuses the
connection, times out, drops it, or answers 5xx before any byte reached the client is avoided
for a few seconds and the next one is tried; once a byte has reached the client the request is
never retried (the client would see two answers run together). A stream is passed on event by
event as each one completes; a stream the upstream cuts mid-way is cut for the client too, so it
sees an error rather than an answer that merely stops.

A replica on a machine reached through its tunnel (`Route.via_tunnel`) is sent the request over
the unix socket the proxy's tunnel hub serves for it (ADR-0015); no socket means that machine's
tunnel is down, a failure like any other, named in the answer when no replica answered.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from einsora.common.bus import names
from einsora.common.schemas import Route
from einsora.common.tunnel_clients import TunnelClients
from einsora.gateway.answers import StreamReader, Usage, answer_text, usage_of
from einsora.gateway.balance import Balancer
from einsora.gateway.counting import Api
from einsora.gateway.errors import SERVER, error_response
from einsora.gateway.sse import EventSplitter

log = logging.getLogger("einsora.gateway.forward")

UPSTREAM_FAILURES = (aiohttp.ClientError, OSError, TimeoutError)
LARGE_BODY = 1024 * 1024
CLIENT_GONE = 499
"""The status recorded for a request whose client went away mid-answer (nginx's)."""
CUT = 502
"""The status recorded for a stream its upstream cut mid-way."""


@dataclass(slots=True)
class Outcome:
    """How a request went upstream: what to answer, and what to count."""

    response: web.StreamResponse
    route: Route | None
    """The replica that answered, or the last one tried (None: none was)."""
    status: int
    answered: bool
    """Whether a replica answered at all (if not, the request used no tokens)."""
    usage: Usage | None = None
    text: str = ""
    """The generated text, when the answer carried no usage, or one not all counts (to count
    it)."""


def _is_event_stream(upstream: aiohttp.ClientResponse) -> bool:
    # An upstream that answers a stream request with one JSON body is passed on whole.
    return upstream.content_type == "text/event-stream"


def _upstream_headers(route: Route, request_id: str) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept-Encoding": "identity",
        # Not `X-Request-ID`: llama.cpp's server refuses a request whose X-Request-ID is not a
        # UUID (400, empty body), and ours are not.
        names.REQUEST_ID_HEADER: request_id,
    }
    if route.token:
        headers["Authorization"] = f"Bearer {route.token}"
    return headers


class Forwarder:
    """Sends requests to replicas through one shared keep-alive client session (and one per
    tunnel socket for replicas behind a machine's tunnel)."""

    def __init__(
        self,
        client: aiohttp.ClientSession,
        balancer: Balancer,
        tunnels: TunnelClients | None = None,
    ) -> None:
        self._client = client
        self._balancer = balancer
        self._tunnels = tunnels

    async def forward(
        self,
        request: web.Request,
        request_id: str,
        api: Api,
        replicas: Sequence[Route],
        payload: bytes,
        *,
        stream: bool,
        drop_usage: bool,
        headers: Mapping[str, str] | None = None,
    ) -> Outcome:
        """`headers`: added to the answer a replica gives (a fallback model's name, say)."""
        extra = dict(headers or {})
        tried: Route | None = None
        failed_status: int | None = None
        tunnel_down: str | None = None
        for route in self._balancer.order(replicas):
            tried = route
            url = f"http://{route.host}:{route.port}/v1/{api.value}"
            # A large body goes as a file-like object, written in pieces between other work.
            data = io.BytesIO(payload) if len(payload) > LARGE_BODY else payload
            try:
                client = await self._client_for(route)
                upstream = await client.post(
                    url, data=data, headers=_upstream_headers(route, request_id)
                )
            except UPSTREAM_FAILURES as exc:
                down = route.via_tunnel and isinstance(exc, aiohttp.ClientConnectorError)
                tunnel_down = route.machine_id if down else tunnel_down
                self._failed(
                    route, f"{route.machine_id}'s tunnel is not connected" if down else exc
                )
                continue
            try:
                if upstream.status >= 500:
                    failed_status = upstream.status
                    self._failed(route, f"HTTP {upstream.status}")
                    continue
                if stream and upstream.status == 200 and _is_event_stream(upstream):
                    outcome = await self._pass_stream(
                        request, request_id, api, route, upstream, drop_usage, extra
                    )
                    if outcome is None:
                        continue  # cut before the first event: nothing reached the client
                    return outcome
                return await self._pass_whole(request_id, api, route, upstream, extra)
            except UPSTREAM_FAILURES as exc:
                self._failed(route, exc)
                continue
            finally:
                upstream.release()
        return self._no_answer(request_id, tried, failed_status, tunnel_down)

    async def _client_for(self, route: Route) -> aiohttp.ClientSession:
        if not route.via_tunnel:
            return self._client
        if self._tunnels is None:
            raise aiohttp.ClientConnectionError("this gateway reaches no tunnel")
        return await self._tunnels.session(route)

    def _failed(self, route: Route, why: object) -> None:
        self._balancer.failed(route)
        log.warning(
            "replica failed; trying another",
            extra={
                "workload": route.workload_id,
                "error": why if isinstance(why, str) else repr(why),
            },
        )

    async def _pass_whole(
        self,
        request_id: str,
        api: Api,
        route: Route,
        upstream: aiohttp.ClientResponse,
        extra: dict[str, str],
    ) -> Outcome:
        body = await upstream.read()
        usage: Usage | None = None
        text = ""
        if upstream.status == 200:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = None
            if isinstance(answer, dict):
                usage = usage_of(answer.get("usage"))
                if usage is None or not usage.readable:
                    text = answer_text(api, answer)
        response = web.Response(
            status=upstream.status,
            body=body,
            headers={
                "Content-Type": upstream.headers.get("Content-Type", "application/json"),
                "X-Request-ID": request_id,
                **extra,
            },
        )
        return Outcome(response, route, upstream.status, True, usage, text)

    async def _pass_stream(
        self,
        request: web.Request,
        request_id: str,
        api: Api,
        route: Route,
        upstream: aiohttp.ClientResponse,
        drop_usage: bool,
        extra: dict[str, str],
    ) -> Outcome | None:
        """Pass a stream on as it comes; None if it failed before anything reached the client."""
        splitter = EventSplitter()
        reader = StreamReader(api, drop_usage=drop_usage)
        response: web.StreamResponse | None = None
        status = 200
        while True:
            try:
                chunk = await upstream.content.readany()
            except UPSTREAM_FAILURES as exc:
                if response is None:
                    self._failed(route, exc)
                    return None
                status = CUT
                log.warning(
                    "stream cut by its replica; cutting the client's",
                    extra={"workload": route.workload_id, "error": repr(exc)},
                )
                break
            if not chunk:
                break
            events = [e for e in splitter.feed(chunk) if reader.read(e)]
            if not events:
                continue
            try:
                if response is None:
                    response = web.StreamResponse(
                        status=200,
                        headers={
                            "Content-Type": upstream.headers.get(
                                "Content-Type", "text/event-stream"
                            ),
                            "Cache-Control": "no-cache",
                            "X-Request-ID": request_id,
                            **extra,
                        },
                    )
                    await response.prepare(request)
                await response.write(events[0] if len(events) == 1 else b"".join(events))
            except (ConnectionError, OSError):
                status = CLIENT_GONE  # the client went away: stop the upstream's work too
                upstream.close()
                break
        if response is None:
            # A stream that ended with no event at all: answer it as the (empty) stream it was.
            response = web.StreamResponse(
                status=200,
                headers={
                    "Content-Type": "text/event-stream",
                    "X-Request-ID": request_id,
                    **extra,
                },
            )
            await response.prepare(request)
        if status == CUT:
            upstream.close()
            if request.transport is not None:
                # No terminating chunk: the client's HTTP library reports an incomplete body.
                request.transport.close()
        elif status == 200:
            rest = splitter.rest()
            try:
                if rest:
                    await response.write(rest)
                await response.write_eof()
            except (ConnectionError, OSError):
                status = CLIENT_GONE
        usage = reader.usage
        text = reader.text() if usage is None or not usage.readable else ""
        return Outcome(response, route, status, True, usage, text)

    def _no_answer(
        self,
        request_id: str,
        tried: Route | None,
        failed_status: int | None,
        tunnel_down: str | None = None,
    ) -> Outcome:
        if failed_status is None and tunnel_down is not None:
            status, message, code = (
                502,
                f"{tunnel_down}'s tunnel is not connected (the machine may be offline); "
                "try again shortly.",
                "tunnel_not_connected",
            )
        elif failed_status is not None:
            status, message, code = (
                502,
                f"The model's replicas failed (the last answered HTTP {failed_status}); "
                "try again, and if it persists ask the endpoint's owner to look at its logs.",
                "upstream_error",
            )
        else:
            status, message, code = (
                503,
                "No replica of this model answered (it may be restarting); try again shortly.",
                "upstream_unavailable",
            )
        response = error_response(status, message, request_id, code=code, type_=SERVER)
        return Outcome(response, tried, status, False)
