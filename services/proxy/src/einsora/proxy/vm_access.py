"""A VM's own paths on its site: the serial console page, the console's socket, and SSH.

They live under `/_einsora/` on the VM's site, so they need what every request there needs: the
site's session cookie (from a one-time access ticket) and, for the sockets, the site's own
`Origin`. The VM's other paths go to its web UI (`http_port`) as for any workload.

- `GET /_einsora/console`: the terminal page (xterm.js, bundled from `services/proxy/console`
  into `static/console/`; a control plane built without Node says so instead).
- `/_einsora/console/ws`: forwarded to the VM's console relay on its machine (the route's
  `console` port, directly or through the machine's tunnel), with the workload's own token added
  here: the relay refuses anything else, and the browser never holds the token.
- `/_einsora/ssh`: a WebSocket whose binary messages are the bytes of one TCP connection to the
  VM's SSH port (`einsora ssh` speaks it). The VM's SSH server is the gate past this point: the
  user's key, given to the guest in its NoCloud seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from einsora.common.schemas import Route
from einsora.common.tunnel_clients import socket_path
from einsora.proxy.forward import forward_websocket

log = logging.getLogger("einsora.proxy")

PREFIX = "/_einsora/"
CONSOLE_PATH = "/_einsora/console"
CONSOLE_SOCKET = "/_einsora/console/ws"
SSH_PATH = "/_einsora/ssh"
STATIC = Path(__file__).parent / "static" / "console"
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
CHUNK = 65536

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Console of {workload}</title>
<link rel="stylesheet" href="/_einsora/console/console.css">
<style>
  html, body {{ height: 100%; margin: 0; background: #111; color: #ddd; font: 14px sans-serif; }}
  header {{ padding: 4px 8px; }}
  #terminal {{ position: absolute; top: 28px; bottom: 0; left: 0; right: 0; }}
</style>
</head>
<body>
<header>Serial console of {workload}: <span id="status">connecting…</span></header>
<div id="terminal"></div>
<script src="/_einsora/console/console.js"></script>
</body>
</html>
"""


def is_vm_path(path: str) -> bool:
    return path in (CONSOLE_PATH, SSH_PATH) or path.startswith(CONSOLE_PATH + "/")


def _headers(request_id: str, content_type: str) -> dict[str, str]:
    return {
        "X-Request-ID": request_id,
        "Content-Type": content_type,
        "Cache-Control": "no-store",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
    }


async def handle(
    request: web.Request,
    route: Route,
    client: aiohttp.ClientSession,
    tunnel_dir: Path,
    register_closer: Callable[[Callable[[], object]], None],
    request_id: str,
) -> web.StreamResponse:
    """One request to a VM's `/_einsora/…` paths (the session and origin already checked)."""
    path = request.path
    if path == CONSOLE_PATH and request.method == "GET":
        page = PAGE.format(workload=route.workload_id)
        return web.Response(text=page, headers=_headers(request_id, "text/html; charset=utf-8"))
    if path.startswith(CONSOLE_PATH + "/") and path.rsplit("/", 1)[1] in ASSETS:
        return _asset(path.rsplit("/", 1)[1], request_id)
    if path == CONSOLE_SOCKET and _upgrade(request):
        port = route.ports.get("console")
        if port is None or not route.token:
            return _text(404, "This VM has no console relay.", request_id)
        relay = route.model_copy(update={"port": port})
        return await forward_websocket(
            request, client, relay, (), register_closer, authorization=f"token {route.token}"
        )
    if path == SSH_PATH and _upgrade(request):
        port = route.ports.get("ssh")
        if port is None:
            return _text(404, "This VM has no SSH port.", request_id)
        return await _bridge(request, route, port, tunnel_dir, register_closer, request_id)
    return _text(404, "No such console path.", request_id)


def no_web_ui(request_id: str) -> web.Response:
    """A VM without `http_port`: its site is its console."""
    return web.Response(
        status=303,
        text="This VM serves no web UI; its console is at /_einsora/console.\n",
        headers={**_headers(request_id, "text/plain"), "Location": CONSOLE_PATH},
    )


def _upgrade(request: web.Request) -> bool:
    return (
        request.headers.get("Upgrade", "").lower() == "websocket"
        and "upgrade" in request.headers.get("Connection", "").lower()
    )


def _text(status: int, text: str, request_id: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", headers=_headers(request_id, "text/plain"))


def _asset(name: str, request_id: str) -> web.Response:
    path = STATIC / name
    if not path.is_file():
        return _text(
            503,
            "The console's terminal was not built on this control plane (make console, which "
            "needs Node).",
            request_id,
        )
    return web.Response(body=path.read_bytes(), headers=_headers(request_id, ASSETS[name]))


async def _bridge(
    request: web.Request,
    route: Route,
    port: int,
    tunnel_dir: Path,
    register_closer: Callable[[Callable[[], object]], None],
    request_id: str,
) -> web.StreamResponse:
    """The WebSocket as one TCP connection to `port` on the VM's machine."""
    try:
        if route.via_tunnel:
            path = socket_path(tunnel_dir, route.machine_id, port)
            reader, writer = await asyncio.open_unix_connection(str(path))
        else:
            reader, writer = await asyncio.open_connection(route.host, port)
    except (OSError, ValueError) as exc:
        log.warning("vm ssh port unreachable", extra={"error": exc.__class__.__name__})
        where = (
            f"{route.machine_id}'s tunnel is not connected"
            if route.via_tunnel
            else ("The VM's SSH port did not answer")
        )
        return _text(502, f"{where}.", request_id)
    ws = web.WebSocketResponse(max_msg_size=0, heartbeat=30)
    await ws.prepare(request)
    register_closer(lambda: asyncio.ensure_future(ws.close()))
    log.info("ssh session opened", extra={"workload": route.workload_id})

    async def upstream() -> None:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                writer.write(msg.data)
                await writer.drain()
            elif msg.type == aiohttp.WSMsgType.TEXT:
                writer.write(msg.data.encode())
                await writer.drain()
            else:
                return

    async def downstream() -> None:
        while data := await reader.read(CHUNK):
            await ws.send_bytes(data)

    pumps = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pumps:
            task.cancel()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        await ws.close()
        log.info("ssh session closed", extra={"workload": route.workload_id})
    return ws
