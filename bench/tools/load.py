"""The load generator for proxy benchmarks, run as its own process.

`python bench/tools/load.py URL HOST COOKIE` prints one JSON object: sequential latencies
(2,000 small requests, one at a time), throughput with 50 concurrent clients, and WebSocket echo
round trips. HOST and COOKIE may be empty (straight to the upstream).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp

SEQUENTIAL = 2000
CONCURRENT_CLIENTS = 50
CONCURRENT_SECONDS = 5.0
WS_ROUNDS = 1000


async def main(url: str, host: str, cookie: str) -> None:
    headers = {}
    if host:
        headers["Host"] = host
    if cookie:
        headers["Cookie"] = cookie
    connector = aiohttp.TCPConnector(limit=CONCURRENT_CLIENTS + 5)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(200):  # warm up connections and code paths
            async with http.get(url + "/", headers=headers) as resp:
                await resp.read()
        latencies = []
        for _ in range(SEQUENTIAL):
            t0 = time.perf_counter()
            async with http.get(url + "/", headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            latencies.append(time.perf_counter() - t0)

        done = 0
        deadline = time.perf_counter() + CONCURRENT_SECONDS

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with http.get(url + "/", headers=headers) as resp:
                    await resp.read()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CONCURRENT_CLIENTS)))
        throughput = done / (time.perf_counter() - t0)

        ws_headers = dict(headers)
        if host:
            ws_headers["Origin"] = f"http://{host}"
        ws_times = []
        async with http.ws_connect(
            url.replace("http", "ws", 1) + "/ws", headers=ws_headers
        ) as sock:
            for i in range(WS_ROUNDS):
                t0 = time.perf_counter()
                await sock.send_str(str(i))
                await sock.receive_str()
                ws_times.append(time.perf_counter() - t0)
    print(json.dumps({"latencies_s": latencies, "throughput_per_s": throughput, "ws_s": ws_times}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
