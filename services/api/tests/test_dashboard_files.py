"""The dashboard's files as the api serves them (ADR-0019): its pages at the app's own paths with
a strict Content-Security-Policy, its hashed assets cached for good, every other path the API's
JSON 404, and a page that says how to build it when it is not built."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from einsora.api.dashboard import CSP, SPA_PATHS
from einsora.api.testing import RunningApi, running_api
from einsora.common.settings import Settings
from einsora.common.testing import Bus


def _settings(bus: Bus, sqlite_url: str, data_dir: Path) -> Settings:
    return Settings(nats_url=bus.url, database_url=sqlite_url, data_dir=data_dir)


INDEX = b'<!doctype html><title>Einsora</title><script type="module" src="/assets/app-1.js">'


@pytest_asyncio.fixture
async def built_api(
    bus: Bus, sqlite_url: str, data_dir: Path, tmp_path: Path
) -> AsyncIterator[RunningApi]:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_bytes(INDEX)
    (dist / "assets" / "app-1.js").write_text("console.log('hi')")
    (dist / "favicon.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    (tmp_path / "secret.txt").write_text("not for the web")
    settings = _settings(bus, sqlite_url, data_dir).model_copy(update={"dashboard_dir": dist})
    async with running_api(settings) as running:
        yield running


async def test_every_page_of_the_app_is_its_index_with_a_strict_policy(
    built_api: RunningApi,
) -> None:
    anon = built_api.client(None)
    for path in SPA_PATHS:
        page = await anon.get(path.replace("{id}", "w-0000000000aaaaaaaaaa"))
        assert page.status == 200, path
        assert page.text.encode() == INDEX
        assert page.headers["Content-Type"].startswith("text/html")
        assert page.headers["Content-Security-Policy"] == CSP
        assert page.headers["X-Frame-Options"] == "DENY"
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert page.headers["Cache-Control"] == "no-cache"
    assert "frame-ancestors 'none'" in CSP
    assert "script-src 'self'" in CSP
    assert "unsafe" not in CSP


async def test_assets_are_cached_for_good_and_nothing_else_is_served(
    built_api: RunningApi,
) -> None:
    anon = built_api.client(None)
    asset = await anon.get("/assets/app-1.js")
    assert asset.status == 200
    assert asset.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert asset.headers["Content-Security-Policy"] == CSP
    assert (await anon.get("/favicon.svg")).status == 200
    for path in (
        "/assets/missing.js",
        "/assets/../index.html",
        "/assets/%2e%2e/%2e%2e/secret.txt",
        "/secret.txt",
        "/index.html",
        "/v1/nope",
        "/nope",
    ):
        answer = await anon.get(path)
        assert answer.status == 404, path
        assert answer.body["error"] == "not_found", path
        assert answer.body["request_id"] == answer.request_id
    site = f"w-0000000000aaaaaaaaaa.localhost:{built_api.service.settings.proxy_port}"
    at_a_site = await anon.get("/workloads", headers={"Host": site})
    assert at_a_site.status == 404  # a workload's site is never the dashboard
    refused = await anon.post("/workloads", {})
    assert refused.status == 405
    assert refused.headers["Allow"] == "GET, HEAD"


async def test_without_a_build_each_page_says_how_to_build_it(
    bus: Bus, sqlite_url: str, data_dir: Path, tmp_path: Path
) -> None:
    settings = _settings(bus, sqlite_url, data_dir).model_copy(
        update={"dashboard_dir": tmp_path / "not-built"}
    )
    async with running_api(settings) as api:
        page = await api.client(None).get("/")
        assert page.status == 404
        assert page.headers["Content-Type"].startswith("text/html")
        assert "make dashboard" in page.text
        assert "Node.js 20" in page.text
        assert page.headers["Content-Security-Policy"] == CSP
        assert (await api.owner.get("/v1/me")).status == 200  # the API works all the same
