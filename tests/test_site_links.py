"""The api's access links and the proxy's sites are named from the same Settings.

With `proxy_domain=lab.example` and `proxy_tls` on (a front terminates TLS and hands the proxy
plain HTTP with the original Host), the link the api mints must name a site the proxy serves:
the request is dialled at the proxy on 127.0.0.1 with the link's own Host, as the front would.
"""

from __future__ import annotations

from http.cookies import SimpleCookie
from urllib.parse import urlsplit

import aiohttp
import pytest
from tests.conftest import OpenApi, StartPlane

pytestmark = pytest.mark.slow

DOMAIN = "lab.example"


async def test_a_minted_link_reaches_the_workload_on_a_non_default_domain(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(
        driver="process", settings={"proxy_domain": DOMAIN, "proxy_tls": True}
    )
    assert plane.proxy is not None
    api = await api_of(plane)
    workload = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    await api.wait_state(workload["id"], "running", within_s=120)

    access = await api.ok("POST", f"/v1/workloads/{workload['id']}/access")
    link = urlsplit(access["url"])
    assert link.scheme == "https"
    assert link.hostname == f"{workload['id']}.{DOMAIN}"
    assert link.port == plane.proxy.port

    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        proxy = f"http://127.0.0.1:{plane.proxy.port}"
        async with http.get(
            f"{proxy}{link.path}?{link.query}",
            headers={"Host": link.netloc},
            allow_redirects=False,
        ) as entered:
            assert entered.status == 303, await entered.text()
            set_cookie = entered.headers["Set-Cookie"]
        # Over TLS the site cookie is `__Host-` and Secure, as the proxy's config says.
        assert "Secure" in set_cookie
        morsel = SimpleCookie(set_cookie)["__Host-einsora-site"]
        async with http.get(
            f"{proxy}/api/status",
            headers={"Host": link.netloc, "Cookie": f"{morsel.key}={morsel.value}"},
        ) as status:
            assert status.status == 200
            assert "started" in await status.json()  # Jupyter's own answer
