"""Request heads (the request line and headers) are bounded in size and in time (issue 34, N6).

Eight connections each sending 64 MiB of headers once raised the api's memory by 512 MiB, and a
head sent a byte at a time held its connection for ever. What a client relies on now: a head
over the limit is answered 431 (the api's JSON error, with a request ID) and its connection
closed, before the api has read more than a little of it, so the api's memory stays where it was;
a head that does not arrive whole in time is answered 408 and closed; a connection that sends
nothing is closed; and ordinary requests, big cookies, bodies and kept-alive connections go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from einsora.api.protocols import MAX_HEAD_BYTES
from einsora.api.testing import RunningApi, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus

MIB = 1024 * 1024
HEAD_TIMEOUT_S = 1.0
"""The head timeout of these tests' api: short, so a slow head's end comes quickly."""


@pytest_asyncio.fixture
async def api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    settings = Settings(
        nats_url=bus.url,
        database_url=sqlite_url,
        data_dir=data_dir,
        region="local",
        api_header_timeout_s=HEAD_TIMEOUT_S,
    )
    async with running_api(settings) as running:
        yield running


def _rss() -> int:
    """This process's resident memory in bytes (the api under test runs in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def _connect(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _until_closed(sock: socket.socket, within_s: float) -> bytes:
    """Every byte the server sends until it closes the connection; fails if it keeps it open."""
    loop = asyncio.get_running_loop()
    received = bytearray()
    try:
        async with asyncio.timeout(within_s):
            while True:
                try:
                    data = await loop.sock_recv(sock, 65536)
                except ConnectionResetError:
                    break  # closed with our bytes unread: what it sent before is all here
                if not data:
                    break
                received += data
    except TimeoutError:
        raise AssertionError(
            f"the connection was kept open for {within_s} s; received {bytes(received)!r}"
        ) from None
    return bytes(received)


def _answers(data: bytes) -> list[tuple[int, dict[str, str], Any]]:
    """The HTTP answers in `data`: status, headers (lower-case names), body as JSON."""
    answers = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers.get("content-length", "0"))
        body, data = data[:length], data[length:]
        answers.append((int(status_line.split()[1]), headers, json.loads(body) if body else None))
    return answers


def _assert_refused(answer: tuple[int, dict[str, str], Any], status: int, code: str) -> None:
    got, headers, body = answer
    assert got == status, answer
    assert body["error"] == code, body
    assert body["request_id"] == headers["x-request-id"]
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"


async def _flood(port: int, total: int) -> tuple[int, bytes]:
    """A request whose one header goes on for `total` bytes, written as fast as the api reads
    it: how many bytes were written before the api stopped reading, and what it answered."""
    loop = asyncio.get_running_loop()
    sock = await _connect(port)
    sent = 0

    async def write() -> None:
        nonlocal sent
        chunk = b"a" * 65536
        with contextlib.suppress(OSError):
            await loop.sock_sendall(sock, b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Flood: ")
            while sent < total:
                await loop.sock_sendall(sock, chunk)
                sent += len(chunk)

    writer = asyncio.create_task(write())
    try:
        answered = await _until_closed(sock, within_s=30)
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        sock.close()
    return sent, answered


async def test_huge_heads_on_many_connections_are_cut_off_and_memory_stays_flat(
    api: RunningApi,
) -> None:
    port = api.service.port
    assert port is not None
    assert (await api.owner.get("/v1/me")).status == 200  # warm: the first answers allocate
    before = peak = _rss()
    flooding = True

    async def watch() -> None:
        nonlocal peak
        while flooding:
            peak = max(peak, _rss())
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        floods = await asyncio.gather(*(_flood(port, 64 * MIB) for _ in range(8)))
    finally:
        flooding = False
        await watcher
    for sent, answered in floods:
        # Cut off long before its end: what was written beyond the limit sat in socket buffers.
        assert sent < 16 * MIB, sent
        for answer in _answers(answered):  # a reset may come before the answer is read
            _assert_refused(answer, 431, "headers_too_large")
    assert peak - before < 48 * MIB, f"memory grew by {(peak - before) / MIB:.0f} MiB"
    # The api goes on answering, on fresh connections.
    assert (await api.owner.get("/v1/me")).status == 200


async def test_a_head_over_the_limit_is_answered_431_naming_the_limit(api: RunningApi) -> None:
    port = api.service.port
    assert port is not None
    sock = await _connect(port)
    try:
        head = b"GET /v1/me HTTP/1.1\r\nHost: api\r\nX-Big: " + b"b" * MAX_HEAD_BYTES
        await asyncio.get_running_loop().sock_sendall(sock, head)  # no end: it never comes
        [answer] = _answers(await _until_closed(sock, within_s=10))
    finally:
        sock.close()
    _assert_refused(answer, 431, "headers_too_large")
    assert str(MAX_HEAD_BYTES) in answer[2]["message"]


async def test_a_slow_head_is_answered_408_once_its_time_is_up(api: RunningApi) -> None:
    port = api.service.port
    assert port is not None
    loop = asyncio.get_running_loop()
    sock = await _connect(port)
    started = time.monotonic()

    async def drip() -> None:
        """A header, a byte every 50 ms: slower than any client, faster than any idle cut."""
        with contextlib.suppress(OSError):
            await loop.sock_sendall(sock, b"GET /v1/me HTTP/1.1\r\nHost: api\r\nX-Slow: ")
            while True:
                await loop.sock_sendall(sock, b"s")
                await asyncio.sleep(0.05)

    dripping = asyncio.create_task(drip())
    try:
        answered = await _until_closed(sock, within_s=10 * HEAD_TIMEOUT_S)
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripping
        sock.close()
    elapsed = time.monotonic() - started
    assert HEAD_TIMEOUT_S * 0.9 <= elapsed < HEAD_TIMEOUT_S * 5, elapsed
    [answer] = _answers(answered)
    _assert_refused(answer, 408, "header_timeout")


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer(
    api: RunningApi,
) -> None:
    port = api.service.port
    assert port is not None
    sock = await _connect(port)
    started = time.monotonic()
    try:
        answered = await _until_closed(sock, within_s=10 * HEAD_TIMEOUT_S)
    finally:
        sock.close()
    assert answered == b""
    assert time.monotonic() - started >= HEAD_TIMEOUT_S * 0.9


async def test_ordinary_requests_big_cookies_bodies_and_kept_alive_connections_go_on(
    api: RunningApi,
) -> None:
    port = api.service.port
    assert port is not None
    token = api.owner.token
    assert token is not None
    loop = asyncio.get_running_loop()
    cookie = "theirs=" + "c" * (MAX_HEAD_BYTES // 2)  # another app's cookies on this host
    body = json.dumps({"name": "x" * 60_000}).encode()  # a body counts against its own limit
    requests = [
        f"GET /v1/me HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {token}\r\n"
        f"Cookie: {cookie}\r\n\r\n".encode(),
        (
            f"POST /v1/tokens HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body,
        # The last, on the same connection, after the time a head may take: an idle kept-alive
        # connection is not a slow head.
        f"GET /v1/me HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {token}\r\n"
        "Connection: close\r\n\r\n".encode(),
    ]
    sock = await _connect(port)
    statuses = []
    try:
        for i, request in enumerate(requests):
            if i == len(requests) - 1:
                await asyncio.sleep(HEAD_TIMEOUT_S * 1.5)
            await loop.sock_sendall(sock, request)
            data = b""
            while b"\r\n\r\n" not in data:
                data += await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
            head, _, rest = data.partition(b"\r\n\r\n")
            headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:])
            length = int({k.lower(): v for k, v in headers.items()}["content-length"])
            while len(rest) < length:
                rest += await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
            statuses.append(int(head.split()[1]))
    finally:
        sock.close()
    # The token's name is over its own limit: refused by the schema, not by the head's.
    assert statuses == [200, 422, 200]
