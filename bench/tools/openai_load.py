"""The load generator for the gateway benchmark, run as its own process.

`python bench/tools/openai_load.py BASE_URL KEY MODEL` prints one JSON object: latencies of
2,000 sequential chat completions (one at a time), time to first byte of 300 sequential
streams, and throughput with 100 concurrent clients. KEY may be empty (no Authorization).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp

SEQUENTIAL = 2000
STREAMS = 300
CONCURRENT_CLIENTS = 100
CONCURRENT_SECONDS = 5.0


async def main(base: str, key: str, model: str) -> None:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "say hi"}], "max_tokens": 8}
    ).encode()
    stream_body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "say hi"}],
            "max_tokens": 8,
            "stream": True,
        }
    ).encode()
    url = f"{base}/chat/completions"
    connector = aiohttp.TCPConnector(limit=CONCURRENT_CLIENTS + 5)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one() -> None:
            async with http.post(url, data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, (resp.status, await resp.text())

        for _ in range(200):  # warm up connections and code paths
            await one()
        latencies = []
        for _ in range(SEQUENTIAL):
            t0 = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - t0)

        first_bytes = []
        for _ in range(STREAMS):
            t0 = time.perf_counter()
            async with http.post(url, data=stream_body, headers=headers) as resp:
                assert resp.status == 200, resp.status
                await resp.content.readany()
                first_bytes.append(time.perf_counter() - t0)
                await resp.read()

        done = 0
        deadline = time.perf_counter() + CONCURRENT_SECONDS

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await one()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CONCURRENT_CLIENTS)))
        throughput = done / (time.perf_counter() - t0)
    print(
        json.dumps(
            {"latencies_s": latencies, "first_byte_s": first_bytes, "throughput_per_s": throughput}
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
