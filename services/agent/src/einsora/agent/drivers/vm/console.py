"""A VM's serial console, relayed to the access proxy as a WebSocket that needs its token.

The guest's serial port is a pseudo-terminal on the host (libvirt's `<serial type='pty'>`),
which only root can open: nothing listens on a port for it. The relay listens on 127.0.0.1 at
a port of its own (the route's `console` port, reached directly or through the machine's
tunnel) and takes one kind of request: a WebSocket upgrade carrying `Authorization: token …`
with the workload's own token, which the proxy adds and no browser ever sees. Bytes from the
terminal go to every connected socket as binary messages; what a socket sends goes to the
terminal. The last `SCROLLBACK` bytes are replayed to a new socket, so a person who opens the
console sees the boot messages and the prompt, not a blank screen.

The terminal is opened when the first socket connects (its path is read from the running
domain each time: it changes when the VM restarts) and closed when the last one leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
from collections.abc import Awaitable, Callable

from aiohttp import WSMsgType, web

log = logging.getLogger("einsora.agent")

SCROLLBACK = 64 * 1024
HOST = "127.0.0.1"


class ConsoleRelay:
    """The console relay of one VM: `pty()` says where its terminal is now."""

    def __init__(self, workload_id: str, token: str, pty: Callable[[], Awaitable[str | None]]):
        self.workload_id = workload_id
        self._token = token
        self._pty = pty
        self._sockets: set[web.WebSocketResponse] = set()
        self._fd: int | None = None
        self._scrollback = bytearray()
        self._sending: set[asyncio.Future[None]] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, port: int = 0) -> int:
        """Listen on 127.0.0.1:`port` (0: any free one); the port it listens on."""
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)  # the proxy forwards its own path
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        self._close_pty()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _authorised(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        expected = f"token {self._token}"
        return hmac.compare_digest(given.encode(), expected.encode())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not self._authorised(request):
            log.warning("console relay refused a request without the workload's token")
            return web.Response(status=403, text="forbidden\n")
        ws = web.WebSocketResponse(heartbeat=30)
        if not ws.can_prepare(request).ok:
            return web.Response(status=400, text="a WebSocket upgrade is expected\n")
        await ws.prepare(request)
        try:
            await self._open_pty()
        except OSError as exc:
            await ws.send_bytes(f"\r\n[einsora: the console is not available: {exc}]\r\n".encode())
            await ws.close()
            return ws
        self._sockets.add(ws)
        if self._scrollback:
            await ws.send_bytes(bytes(self._scrollback))
        try:
            async for msg in ws:
                if msg.type in (WSMsgType.BINARY, WSMsgType.TEXT) and self._fd is not None:
                    data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                    with contextlib.suppress(BlockingIOError):
                        os.write(self._fd, data)
        finally:
            self._sockets.discard(ws)
            if not self._sockets:
                self._close_pty()
        return ws

    async def _open_pty(self) -> None:
        if self._fd is not None:
            return
        path = await self._pty()
        if path is None:
            raise OSError("the VM has no serial terminal now (is it running?)")
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        self._fd = fd
        asyncio.get_running_loop().add_reader(fd, self._readable)

    def _readable(self) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the VM stopped: its terminal is gone
            self._close_pty()
            return
        self._scrollback += data
        del self._scrollback[:-SCROLLBACK]
        for ws in list(self._sockets):
            task = asyncio.ensure_future(_send(ws, data))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    def _close_pty(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)


async def _send(ws: web.WebSocketResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_bytes(data)
