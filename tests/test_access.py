"""The access proxy's security table, end to end: real api (tickets), real scheduler (routes),
real agent running real Jupyter servers, and the real proxy, reached over HTTP on loopback.

Header- and body-level rows that need a controllable upstream (Set-Cookie with Domain, the
dashboard's cookie stripped, streaming) are in services/proxy/tests/test_forwarding.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import aiohttp
import pytest
import pytest_asyncio
from tests.conftest import Api, OpenApi, StartPlane

from einsora.cli.controlplane import ControlPlane
from einsora.common.schemas import utcnow

pytestmark = pytest.mark.slow


@dataclass
class Sites:
    plane: ControlPlane
    api: Api
    a: str
    b: str
    http: aiohttp.ClientSession

    @property
    def port(self) -> int:
        assert self.plane.proxy is not None
        return self.plane.proxy.port

    def host(self, workload_id: str) -> str:
        return f"{workload_id}.localhost:{self.port}"

    async def ticket(self, workload_id: str) -> str:
        access = await self.api.ok("POST", f"/v1/workloads/{workload_id}/access")
        url = urlsplit(access["url"])
        assert url.hostname == f"{workload_id}.localhost"
        assert url.path == "/_einsora/enter"
        ticket: str = url.query.removeprefix("ticket=")
        return ticket

    async def enter(self, host_of: str, ticket: str, extra: str = "") -> aiohttp.ClientResponse:
        resp = await self.http.get(
            f"http://127.0.0.1:{self.port}/_einsora/enter?ticket={ticket}{extra}",
            headers={"Host": self.host(host_of)},
            allow_redirects=False,
        )
        await resp.read()
        return resp

    async def cookie_for(self, workload_id: str) -> str:
        resp = await self.enter(workload_id, await self.ticket(workload_id))
        assert resp.status == 303
        morsel = resp.cookies["einsora-site"]
        return f"einsora-site={morsel.value}"

    def token_of(self, workload_id: str) -> str:
        assert self.plane.proxy is not None
        route = self.plane.proxy.route(workload_id)
        assert route is not None
        assert route.token is not None
        return route.token


@pytest_asyncio.fixture(scope="module")
async def sites(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sites]:
    from tests.conftest import api_of as _api_of  # noqa: F401 (fixtures are per test)

    from einsora.common.settings import Settings

    settings = Settings(
        data_dir=tmp_path_factory.mktemp("access"),
        api_port=0,
        proxy_port=0,
        gateway_port=0,
        nats_port=0,
        log_format="text",
    )
    plane = ControlPlane(
        settings,
        agent_driver="process",
        agent_options={"heartbeat_s": 1.0, "poll_s": 0.2, "grace_s": 3.0},
    )
    await plane.start()
    http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
    token = (plane.settings.data_dir / "owner.token").read_text().strip()
    api = Api(http, f"http://127.0.0.1:{plane.api_port}", token)
    a = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    b = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    await api.wait_state(a["id"], "running", within_s=120)
    await api.wait_state(b["id"], "running", within_s=120)
    try:
        yield Sites(plane, api, a["id"], b["id"], http)
    finally:
        await http.close()
        if plane.agent is not None:
            await plane.agent.stop_workloads()
        await plane.stop()


async def test_a_ticket_opens_its_site_once(sites: Sites) -> None:
    ticket = await sites.ticket(sites.a)
    first = await sites.enter(sites.a, ticket)
    assert first.status == 303
    assert first.headers["Location"] == "/lab"
    assert first.headers["Referrer-Policy"] == "no-referrer"
    assert "no-store" in first.headers["Cache-Control"]
    set_cookie = first.headers["Set-Cookie"]
    assert "HttpOnly" in set_cookie
    assert "SameSite=Lax" in set_cookie
    assert "Domain" not in set_cookie  # host-only

    replay = await sites.enter(sites.a, ticket)
    assert replay.status == 403
    assert "Set-Cookie" not in replay.headers


async def test_two_racing_redemptions_one_wins(sites: Sites) -> None:
    ticket = await sites.ticket(sites.a)
    answers = await asyncio.gather(*(sites.enter(sites.a, ticket) for _ in range(8)))
    assert sorted(r.status for r in answers) == [303] + [403] * 7


async def test_an_expired_ticket_is_refused(sites: Sites) -> None:
    ticket = await sites.ticket(sites.a)
    api = sites.plane.api
    assert api is not None
    real = api.clock
    api.clock = lambda: real() + timedelta(seconds=61)
    try:
        late = await sites.enter(sites.a, ticket)
    finally:
        api.clock = real
    assert late.status == 403
    assert "expired" in await late.text()
    assert "Set-Cookie" not in late.headers


async def test_a_ticket_is_refused_on_another_site(sites: Sites) -> None:
    ticket = await sites.ticket(sites.a)
    elsewhere = await sites.enter(sites.b, ticket)
    assert elsewhere.status == 403
    assert "Set-Cookie" not in elsewhere.headers


async def test_a_cookie_of_one_site_does_not_open_another(sites: Sites) -> None:
    cookie = await sites.cookie_for(sites.a)
    async with sites.http.get(
        f"http://127.0.0.1:{sites.port}/api/status",
        headers={"Host": sites.host(sites.a), "Cookie": cookie},
    ) as ok:
        assert ok.status == 200
    async with sites.http.get(
        f"http://127.0.0.1:{sites.port}/api/status",
        headers={"Host": sites.host(sites.b), "Cookie": cookie},
    ) as other:
        assert other.status == 403


@pytest.mark.parametrize(
    "make_host",
    [
        lambda w, p: f"{w}.localhost.:{p}",
        lambda w, p: f"{w.upper()}.localhost:{p}",
        lambda w, p: f"{w}.localhost.evil.com:{p}",
        lambda w, p: f"w-0000000000zzzzzzzzzz.localhost:{p}",
    ],
)
async def test_hostile_hosts_reach_nothing(sites: Sites, make_host: object) -> None:
    cookie = await sites.cookie_for(sites.a)
    host = make_host(sites.a, sites.port)  # type: ignore[operator]
    async with sites.http.get(
        f"http://127.0.0.1:{sites.port}/api/status", headers={"Host": host, "Cookie": cookie}
    ) as resp:
        assert resp.status == 404


async def test_x_forwarded_host_is_ignored(sites: Sites) -> None:
    cookie = await sites.cookie_for(sites.a)
    headers = {
        "Host": f"localhost:{sites.port}",
        "X-Forwarded-Host": sites.host(sites.a),
        "Forwarded": f"host={sites.host(sites.a)}",
        "Cookie": cookie,
    }
    async with sites.http.get(f"http://127.0.0.1:{sites.port}/api/status", headers=headers) as resp:
        assert resp.status == 404


async def test_foreign_origins_cannot_post_or_open_websockets(sites: Sites) -> None:
    cookie = await sites.cookie_for(sites.a)
    base = f"http://127.0.0.1:{sites.port}"
    evil = {"Host": sites.host(sites.a), "Cookie": cookie, "Origin": "http://evil.com"}
    async with sites.http.post(f"{base}/api/kernels", json={}, headers=evil) as resp:
        assert resp.status == 403
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await sites.http.ws_connect(f"{base}/api/events/subscribe", headers=evil)
    assert refused.value.status == 403
    own = {**evil, "Origin": f"http://{sites.host(sites.a)}"}
    async with sites.http.post(f"{base}/api/kernels", json={}, headers=own) as resp:
        assert resp.status == 201  # the site itself may; the proxy added the token
        kernel = await resp.json()
    async with sites.http.delete(f"{base}/api/kernels/{kernel['id']}", headers=own) as resp:
        assert resp.status == 204


@pytest.mark.parametrize(
    "target", ["//evil.com", "/\\evil.com", "%2F%2Fevil.com", "/%2F%2Fevil.com", "https://evil.com"]
)
async def test_open_redirects_are_refused(sites: Sites, target: str) -> None:
    resp = await sites.enter(sites.a, await sites.ticket(sites.a), f"&next={target}")
    assert resp.status == 303
    assert resp.headers["Location"] == "/lab"


async def test_the_token_is_in_no_response_url_or_log_line(
    sites: Sites, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = sites.token_of(sites.a)
    ticket = await sites.ticket(sites.a)
    entered = await sites.enter(sites.a, ticket)
    cookie = f"einsora-site={entered.cookies['einsora-site'].value}"
    seen = [str(entered.headers)]
    for path in ("/lab", "/api/status", "/api/kernelspecs", "/lab/api/settings", "/api/me"):
        async with sites.http.get(
            f"http://127.0.0.1:{sites.port}{path}",
            headers={"Host": sites.host(sites.a), "Cookie": cookie},
        ) as r:
            seen.append(str(r.status) + str(r.headers) + str(r.url) + await r.text())
    assert all(token not in text for text in seen)
    assert all(token not in record.getMessage() for record in caplog.records)
    assert all(token not in str(record.__dict__) for record in caplog.records)


async def test_a_parked_site_refuses_at_once_and_closes_its_websockets(
    sites: Sites, api_of: OpenApi, start_plane: StartPlane
) -> None:
    cookie = await sites.cookie_for(sites.b)
    base = f"http://127.0.0.1:{sites.port}"
    own = {"Host": sites.host(sites.b), "Cookie": cookie, "Origin": f"http://{sites.host(sites.b)}"}
    sock = await sites.http.ws_connect(f"{base}/api/events/subscribe", headers=own)
    await sites.api.ok("POST", f"/v1/workloads/{sites.b}/park")
    msg = await sock.receive(timeout=30)
    assert msg.type in (
        aiohttp.WSMsgType.CLOSE,
        aiohttp.WSMsgType.CLOSED,
        aiohttp.WSMsgType.CLOSING,
    )
    await sock.close()
    async with sites.http.get(f"{base}/api/status", headers=own) as resp:
        assert resp.status in (403, 404)
    status, body = await sites.api.call("POST", f"/v1/workloads/{sites.b}/access")
    assert status == 409
    assert "parked" in body["message"] or "parking" in body["message"]


def test_access_link_expiry_is_sixty_seconds() -> None:
    # The clock the api uses for tickets is injectable (ApiService.clock); 60 s is the contract.
    from einsora.api.services.access import TICKET_TTL

    assert timedelta(seconds=60) == TICKET_TTL
    assert utcnow().tzinfo is not None
