"""The dashboard's files, served by the api at `/` (issue 18, ADR-0019).

The dashboard is a single-page app built by Vite from `dashboard/` into static files
(`make dashboard`; `make setup` builds it when Node 20+ is there). The api serves its
`index.html` at each of the app's own paths (`SPA_PATHS`, which the app's router mirrors), its
hashed assets under `/assets/` (cached for a year: a new build has new names), and nothing else:
every other path stays the API's JSON 404, so a typo in an API path is never a page.

Every page goes out with a strict Content-Security-Policy (scripts, styles, connections and
images from this origin only, `frame-ancestors 'none'`, no `<base>`, no plug-ins) and the
headers that go with it. When the files are not built, the same paths answer a short page that
says how to build them, and Solo's greeting says so too; the API works either way.
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from einsora.common.settings import Settings
from einsora.common.sites import SiteConfig

SPA_PATHS = (
    "/",
    "/sign-in",
    "/join",
    "/workloads",
    "/workloads/{id}",
    "/launch",
    "/machines",
    "/usage",
    "/gateway-keys",
    "/tokens",
    "/members",
    "/account",
)
"""The dashboard's own paths (its router's routes): each answers `index.html`."""

ROOT_FILES = ("favicon.svg",)
"""Files Vite copies from `dashboard/public/` to the root of the build."""

CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
"""No inline script or style, nothing from another origin, never in a frame."""

SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}

IMMUTABLE = "public, max-age=31536000, immutable"

NOT_BUILT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Einsora: dashboard not built</title></head>
<body><main>
<h1>The Einsora dashboard is not built</h1>
<p>Build it with <code>make dashboard</code> in the Einsora checkout (it needs Node.js 20 or
later), then reload this page. Meanwhile the API answers at <code>/v1</code> and the
<code>einsora</code> command line works as usual.</p>
</main></body></html>
"""


def default_dir() -> Path | None:
    """The workspace's `dashboard/dist`, found from this package's source (None when the api
    is installed on its own: set EINSORA_DASHBOARD_DIR then)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "dashboard" / "package.json").is_file():
            return parent / "dashboard" / "dist"
    return None


class DashboardFiles:
    """The built files at `root` (looked for at each page request, so a build made while the
    api runs is served at once). `sites`: where workloads are served, which is never the
    dashboard (a request for a page there is answered 404)."""

    def __init__(self, root: Path | None, sites: SiteConfig | None = None) -> None:
        self.root = root
        self.sites = sites

    @classmethod
    def from_settings(cls, settings: Settings) -> DashboardFiles:
        return cls(settings.dashboard_dir or default_dir(), SiteConfig.from_settings(settings))

    @property
    def index(self) -> Path | None:
        return None if self.root is None else self.root / "index.html"

    @property
    def built(self) -> bool:
        return self.index is not None and self.index.is_file()

    async def page(self, request: Request) -> Response:
        if self.sites is not None and self.sites.workload_of(request.headers.get("host")):
            raise HTTPException(404)  # a workload's site is never the dashboard
        index = self.index
        try:
            html = index.read_bytes() if index is not None else None
        except OSError:
            html = None
        if html is None:
            return HTMLResponse(NOT_BUILT, status_code=404, headers=_headers("no-store"))
        return HTMLResponse(html, headers=_headers("no-cache"))

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = [
            Route(path, self.page, methods=["GET", "HEAD"], include_in_schema=False)
            for path in SPA_PATHS
        ]
        if self.root is not None:
            assets = _WithHeaders(
                StaticFiles(directory=self.root / "assets", check_dir=False), IMMUTABLE
            )
            routes.append(Mount("/assets", app=assets, name="dashboard-assets"))
            for name in ROOT_FILES:
                routes.append(Route(f"/{name}", self.root_file, methods=["GET", "HEAD"], name=name))
        return routes

    async def root_file(self, request: Request) -> Response:
        """One of `ROOT_FILES` (its name is the route's: never a path from the request)."""
        assert self.root is not None
        path = self.root / request.url.path.lstrip("/")
        if request.url.path.lstrip("/") not in ROOT_FILES or not path.is_file():
            raise HTTPException(404)
        return FileResponse(path, headers=_headers("no-cache"))


def _headers(cache: str) -> dict[str, str]:
    return {**SECURITY_HEADERS, "Cache-Control": cache}


class _WithHeaders:
    """Static files with the dashboard's security headers and a caching policy."""

    def __init__(self, app: StaticFiles, cache: str) -> None:
        self.app = app
        self.raw = [(k.lower().encode(), v.encode()) for k, v in _headers(cache).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                message["headers"] = [*message.get("headers", []), *self.raw]
            await send(message)

        await self.app(scope, receive, send_with_headers)
