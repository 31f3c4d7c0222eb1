"""Forwarding to a workload: HTTP with bodies streamed both ways, and WebSockets.

What crosses the proxy is cleaned in both directions. Upstream: the client's Authorization,
the proxy's own cookie and the dashboard's are removed, a `token` query parameter is removed, and
the workload's own token is added (Jupyter: `Authorization: token …`). Downstream: `Set-Cookie`
headers naming a `Domain` are dropped, `Location` headers pointing at the workload's internal
address are rewritten to its site, and the workload's token is scrubbed from bodies
(JupyterLab's page config embeds it).

A route reached through a machine's tunnel is forwarded over the unix socket the tunnel hub
serves for it (`einsora.common.tunnel_clients`), with one keep-alive client session per socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from einsora.common.schemas import Route, WorkloadKind

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
# Never forwarded from clients: identity and routing are the proxy's to say.
CLIENT_ONLY = frozenset(
    h.lower()
    for h in (
        "Authorization",
        "Cookie",
        "X-Forwarded-Host",
        "X-Forwarded-For",
        "X-Forwarded-Proto",
        "Forwarded",
        "Origin",
        "Referer",
        "Sec-WebSocket-Key",
        "Sec-WebSocket-Version",
        "Sec-WebSocket-Extensions",
        "Sec-WebSocket-Protocol",
    )
)


SMALL_BODY = 256 * 1024


def upstream_base(route: Route) -> str:
    return f"http://{route.host}:{route.port}"


def upstream_path(request: web.Request) -> str:
    """The request's path and query, without any `token` parameter."""
    path = request.rel_url.raw_path
    query = [
        (k, v)
        for k, v in parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True)
        if k != "token"
    ]
    return path + ("?" + urlencode(query) if query else "")


def upstream_headers(
    request: web.Request, route: Route, drop_cookies: Iterable[str]
) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in request.headers.items():
        if key.lower() not in HOP_BY_HOP and key.lower() not in CLIENT_ONLY:
            headers.add(key, value)
    cookie = _without_cookies(request.headers.getall("Cookie", []), set(drop_cookies))
    if cookie:
        headers["Cookie"] = cookie
    if route.token and route.kind is WorkloadKind.notebook:
        headers["Authorization"] = f"token {route.token}"
    if route.token:
        headers["Accept-Encoding"] = "identity"  # so the token can be scrubbed from bodies
    return headers


def _without_cookies(values: list[str], drop: set[str]) -> str:
    kept = []
    for value in values:
        for part in value.split(";"):
            name = part.split("=", 1)[0].strip()
            if name and name not in drop:
                kept.append(part.strip())
    return "; ".join(kept)


def downstream_headers(
    upstream: aiohttp.ClientResponse, route: Route, site_origin: str, *, keep_length: bool
) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    internal = (upstream_base(route), f"http://localhost:{route.port}")
    for key, value in upstream.headers.items():
        low = key.lower()
        if low in HOP_BY_HOP and not (low == "content-length" and keep_length):
            continue
        if low == "set-cookie" and _names_a_domain(value):
            continue
        if low == "location":
            for prefix in internal:
                if value.startswith(prefix):
                    value = site_origin + value[len(prefix) :]
                    break
        headers.add(key, value)
    return headers


def _names_a_domain(set_cookie: str) -> bool:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(set_cookie)
    except Exception:
        return True  # unparseable: not worth the risk
    return any(morsel["domain"] for morsel in jar.values()) or "domain=" in set_cookie.lower()


class Scrubber:
    """Replaces a secret in a byte stream, also where it straddles two chunks."""

    def __init__(self, secret: str | None, replacement: bytes = b""):
        self._secret = secret.encode() if secret else b""
        self._replacement = replacement
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._secret:
            return chunk
        data = (self._tail + chunk).replace(self._secret, self._replacement)
        keep = len(self._secret) - 1
        self._tail, out = data[-keep:] if keep else b"", data[:-keep] if keep else data
        return out

    def flush(self) -> bytes:
        out, self._tail = self._tail, b""
        return out


async def forward_http(
    request: web.Request,
    client: aiohttp.ClientSession,
    route: Route,
    site_origin: str,
    drop_cookies: Iterable[str],
) -> web.StreamResponse:
    url = upstream_base(route) + upstream_path(request)
    body = request.content if request.body_exists else None
    async with client.request(
        request.method,
        url,
        headers=upstream_headers(request, route, drop_cookies),
        data=body,
        allow_redirects=False,
        auto_decompress=False,
    ) as upstream:
        length = upstream.content_length
        if length is not None and length <= SMALL_BODY and request.method != "HEAD":
            # Most answers are small: one read and one write beat a chunked stream.
            payload = await upstream.read()
            if route.token:
                payload = payload.replace(route.token.encode(), b"")
            return web.Response(
                status=upstream.status,
                body=payload,
                headers=downstream_headers(upstream, route, site_origin, keep_length=False),
            )
        response = web.StreamResponse(
            status=upstream.status,
            # With a token to scrub, the length may change: the body goes chunked.
            headers=downstream_headers(
                upstream, route, site_origin, keep_length=route.token is None
            ),
        )
        await response.prepare(request)
        scrubber = Scrubber(route.token)
        async for chunk in upstream.content.iter_any():
            await response.write(scrubber.feed(chunk))
        await response.write(scrubber.flush())
        await response.write_eof()
        return response


async def forward_websocket(
    request: web.Request,
    client: aiohttp.ClientSession,
    route: Route,
    drop_cookies: Iterable[str],
    register_closer: object,
    *,
    authorization: str | None = None,
) -> web.WebSocketResponse:
    """`authorization`: an `Authorization` header of the proxy's own to send upstream (a VM's
    console relay wants the workload's token)."""
    url = "ws" + upstream_base(route)[4:] + upstream_path(request)
    protocols = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]
    headers = upstream_headers(request, route, drop_cookies)
    if authorization is not None:
        headers["Authorization"] = authorization
    upstream = await client.ws_connect(
        url, headers=headers, protocols=protocols, autoping=False, max_msg_size=0
    )
    downstream = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else (),
        autoping=False,
        max_msg_size=0,
    )
    await downstream.prepare(request)
    if callable(register_closer):
        register_closer(lambda: asyncio.ensure_future(_close_both(downstream, upstream)))
    pumps = [
        asyncio.create_task(_pump(upstream, downstream)),
        asyncio.create_task(_pump(downstream, upstream)),
    ]
    _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await _close_both(downstream, upstream)
    return downstream


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> None:
    async for msg in source:
        if msg.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(msg.data)
        elif msg.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
        elif msg.type == aiohttp.WSMsgType.PING:
            await sink.ping(msg.data)
        elif msg.type == aiohttp.WSMsgType.PONG:
            await sink.pong(msg.data)
        else:
            return


async def _close_both(
    downstream: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
) -> None:
    with contextlib.suppress(Exception):
        await downstream.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"session ended")
    with contextlib.suppress(Exception):
        await upstream.close()
