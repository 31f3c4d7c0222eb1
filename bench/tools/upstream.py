"""A tiny upstream for proxy benchmarks: `/` answers a few bytes, `/ws` echoes.

Run as its own process so that the proxy and the load are measured apart from it:
`python bench/tools/upstream.py PORT`.
"""

from __future__ import annotations

import sys

from aiohttp import WSMsgType, web


async def small(_: web.Request) -> web.Response:
    return web.Response(body=b"ok" * 32, content_type="text/plain")


async def echo(request: web.Request) -> web.WebSocketResponse:
    sock = web.WebSocketResponse()
    await sock.prepare(request)
    async for msg in sock:
        if msg.type == WSMsgType.TEXT:
            await sock.send_str(msg.data)
    return sock


def main() -> None:
    app = web.Application()
    app.router.add_get("/ws", echo)
    app.router.add_get("/{tail:.*}", small)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
