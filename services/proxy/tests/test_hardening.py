"""The proxy's answers and log lines never carry a secret, and only a GET uses up a ticket.

Malformed requests go over a raw TCP connection, each carrying a real session cookie, a ticket,
a `?token=` and an `Authorization` header; every log record of every logger is captured at
DEBUG, and also formatted by the project's JSON and text formatters, the way a deployment writes
them. Tickets are minted and redeemed by the real api over a real nats-server: the workload is
marked running in the api's store and its route written to the `routes` bucket, as the
scheduler would (no workload process is needed to enter its site).
"""

from __future__ import annotations

import asyncio
import io
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
import pytest_asyncio
import sqlalchemy as sa

from einsora.api.testing import RunningApi, running_api
from einsora.common import logs
from einsora.common.bus import names
from einsora.common.schemas import Route, WorkloadKind
from einsora.common.settings import Settings
from einsora.common.testing import Bus
from einsora.proxy.service import ProxyService

BAD_REQUEST_TEXT = b"Bad request: it could not be read as HTTP/1.1.\n"


@dataclass
class Site:
    """A running workload's site behind the proxy, with the api that mints its tickets."""

    api: RunningApi
    proxy: ProxyService
    workload_id: str
    http: aiohttp.ClientSession

    @property
    def host(self) -> str:
        return f"{self.workload_id}.localhost:{self.proxy.port}"

    @property
    def enter_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}/_einsora/enter"

    async def ticket(self) -> str:
        access = await self.api.owner.post(f"/v1/workloads/{self.workload_id}/access")
        assert access.status == 201, access.text
        ticket: str = parse_qs(urlsplit(access.body["url"]).query)["ticket"][0]
        return ticket

    async def enter(self, method: str, ticket: str) -> tuple[int, str, dict[str, str]]:
        async with self.http.request(
            method,
            f"{self.enter_url}?ticket={ticket}",
            headers={"Host": self.host},
            allow_redirects=False,
        ) as resp:
            return resp.status, await resp.text(), dict(resp.headers)


@pytest_asyncio.fixture
async def site(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[Site]:
    settings = Settings(
        nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir, region="local", proxy_port=0
    )
    async with running_api(settings) as api:
        proxy = ProxyService(settings)
        await proxy.start()
        made = await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
        workload_id = made.body["id"]
        assert api.service.store is not None
        async with api.service.store.write() as conn:  # as the scheduler's events would
            await conn.execute(
                sa.text("UPDATE workloads SET state = 'running' WHERE id = :id"),
                {"id": workload_id},
            )
        route = Route(
            workload_id=workload_id,
            tenant_id=made.body["tenant_id"],
            kind=WorkloadKind.notebook,
            machine_id="m-1",
            host="127.0.0.1",
            # Never reached: entering a site answers before forwarding anything. Below Linux's
            # ephemeral range (32768-60999), so no port the proxy or its hub bound to port 0
            # can be it: the proxy refuses a route to its own ports (CI once drew 40009).
            port=20009,
            token="workload-token-" + secrets.token_hex(8),
        )
        kv = await bus.js.key_value(names.ROUTES.name)
        await kv.put(names.route_key(workload_id), route.to_bytes())
        deadline = asyncio.get_running_loop().time() + 5
        while proxy.route(workload_id) is None:
            assert asyncio.get_running_loop().time() < deadline, "the proxy never saw the route"
            await asyncio.sleep(0.01)
        try:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
                yield Site(api, proxy, workload_id, http)
        finally:
            await proxy.stop()


@dataclass
class Captured:
    """Every log record, and what the project's formatters made of each."""

    caplog: pytest.LogCaptureFixture
    streams: list[io.StringIO]

    def texts(self) -> list[str]:
        seen = [self.caplog.text] + [s.getvalue() for s in self.streams]
        for record in self.caplog.records:
            seen += [record.getMessage(), repr(record.args), repr(record.__dict__)]
            if record.exc_info:
                seen.append(logging.Formatter().formatException(record.exc_info))
        return seen

    def leaked(self, *secret: str) -> list[str]:
        """The secrets that appear anywhere in what was logged."""
        texts = self.texts()
        return [s for s in secret if any(s in t for t in texts)]

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records]


@pytest.fixture
def captured(caplog: pytest.LogCaptureFixture) -> Iterator[Captured]:
    root = logging.getLogger()
    streams = [io.StringIO(), io.StringIO()]
    handlers: list[logging.StreamHandler[io.StringIO]] = []
    for stream, formatter in zip(
        streams,
        [logs.JsonFormatter(), logs.TextFormatter("%(levelname)s %(name)s: %(message)s")],
        strict=True,
    ):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        handler.setLevel(logging.DEBUG)
        handlers.append(handler)
        root.addHandler(handler)
    for name in ("", "aiohttp", "einsora", "asyncio"):
        caplog.set_level(logging.DEBUG, logger=name)
    try:
        yield Captured(caplog, streams)
    finally:
        for handler in handlers:
            root.removeHandler(handler)


@dataclass(frozen=True)
class Secrets:
    session: str
    ticket: str
    token: str
    bearer: str

    def all(self) -> tuple[str, str, str, str]:
        return (self.session, self.ticket, self.token, self.bearer)


MalformedRequest = Callable[[str, Secrets], bytes]

MALFORMED: dict[str, MalformedRequest] = {
    "bare LF after the request line": lambda host, s: (
        f"GET /_einsora/enter?ticket={s.ticket} HTTP/1.1\nHost: {host}\n"
        f"Cookie: einsora-site={s.session}\nAuthorization: Bearer {s.bearer}\n\n"
    ).encode(),
    "bare LF between headers": lambda host, s: (
        f"GET /lab?token={s.token} HTTP/1.1\r\nHost: {host}\r\n"
        f"Cookie: einsora-site={s.session}\nAuthorization: Bearer {s.bearer}\r\n\r\n"
    ).encode(),
    "control character in a header": lambda host, s: (
        f"GET /lab?token={s.token} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {s.bearer}\r\nCookie: einsora-site={s.session}\x01\r\n\r\n"
    ).encode(),
    "unreadable method": lambda host, s: (
        f"G\x00T /_einsora/enter?ticket={s.ticket}&token={s.token} HTTP/1.1\r\nHost: {host}\r\n"
        f"Cookie: einsora-site={s.session}\r\n\r\n"
    ).encode(),
    "header line too long": lambda host, s: (
        f"GET /lab?token={s.token} HTTP/1.1\r\nHost: {host}\r\n"
        f"Cookie: einsora-site={s.session}; pad={'a' * 20000}\r\n\r\n"
    ).encode(),
    "Content-Length with Transfer-Encoding": lambda host, s: (
        f"POST /lab?token={s.token} HTTP/1.1\r\nHost: {host}\r\n"
        f"Cookie: einsora-site={s.session}\r\nAuthorization: Bearer {s.bearer}\r\n"
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ).encode(),
}


async def _raw(port: int, request: bytes) -> tuple[bytes, bytes]:
    """Send bytes as they are; the answer's head and body (the proxy closes the connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_request_is_neither_logged_nor_echoed(
    site: Site, captured: Captured, case: str
) -> None:
    found = Secrets(
        session=site.proxy.sessions.create(site.workload_id, "t-1", "u-1"),
        ticket=await site.ticket(),
        token="tok" + secrets.token_hex(16),
        bearer="tsk_" + secrets.token_hex(16),
    )
    head, body = await _raw(site.proxy.port, MALFORMED[case](site.host, found))

    status_line = head.split(b"\r\n", 1)[0]
    assert b" 400 " in status_line, head
    assert b"\r\nX-Request-ID: " in head
    assert body == BAD_REQUEST_TEXT  # a fixed text: nothing of the request comes back
    assert not [s for s in found.all() if s.encode() in head + body]
    assert captured.leaked(*found.all()) == []
    assert any(m.startswith("unreadable request refused") for m in captured.messages())


async def test_refusals_of_readable_requests_log_no_secret(site: Site, captured: Captured) -> None:
    session = site.proxy.sessions.create(site.workload_id, "t-1", "u-1")
    token, bearer, forged = secrets.token_hex(16), "tsk_" + secrets.token_hex(16), "x" * 43
    base = f"http://127.0.0.1:{site.proxy.port}"
    sent = {"Host": site.host, "Authorization": f"Bearer {bearer}"}
    status, _, _ = await site.enter("GET", forged)
    assert status == 403
    cookie = {"Cookie": f"einsora-site={session}", "Origin": "http://evil.example"}
    async with site.http.post(f"{base}/api/x?token={token}", headers=sent | cookie) as resp:
        assert resp.status == 403
    async with site.http.get(f"{base}/lab?token={token}", headers=sent | cookie) as resp:
        assert resp.status == 502  # allowed, but the route's port answers nothing
    assert captured.leaked(session, token, bearer, forged) == []


async def test_head_leaves_the_ticket_for_the_following_get(site: Site) -> None:
    ticket = await site.ticket()

    status, text, headers = await site.enter("HEAD", ticket)
    assert status == 200
    assert "Set-Cookie" not in headers
    assert text == ""  # a HEAD answer has no body
    for method in ("POST", "OPTIONS", "PUT"):
        status, _, headers = await site.enter(method, ticket)
        assert status == 405, method
        assert headers["Allow"] == "GET, HEAD"
        assert "Set-Cookie" not in headers

    status, _, headers = await site.enter("GET", ticket)
    assert status == 303
    assert "einsora-site=" in headers["Set-Cookie"]
    status, text, _ = await site.enter("GET", ticket)
    assert status == 403  # the GET was the one use
    assert "already used" in text
