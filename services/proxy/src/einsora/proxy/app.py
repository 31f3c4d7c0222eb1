"""The proxy's HTTP application: ticket redemption, the session check, and forwarding.

Every request is routed on its `Host` header alone. A GET of `/_einsora/enter?ticket=…` redeems
a ticket exactly once (the api decides, atomically) and answers with a host-only cookie and a
redirect to a ticket-free URL; any other method leaves the ticket unused. Everything else needs
that site's cookie; state-changing requests and WebSocket upgrades must also come from the site's
own origin, because the token the proxy injects turns off the workload's own CSRF defence.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from nats.aio.client import Client as NATS
from opentelemetry import trace

from einsora.common import logs, telemetry
from einsora.common.aiohttp_edge import counting_middleware, tracing_middlewares
from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import AccessRedeemReply, AccessRedeemRequest, WorkloadKind
from einsora.common.tunnel_clients import TunnelClients
from einsora.proxy import vm_access
from einsora.proxy.forward import forward_http, forward_websocket
from einsora.proxy.metrics import ProxyMetrics, kind_of
from einsora.proxy.routes import RouteTable
from einsora.proxy.sessions import SessionStore
from einsora.proxy.sites import DASHBOARD_COOKIE, ENTER_PATH, SiteConfig

log = logging.getLogger("einsora.proxy")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SAFE_NEXT = re.compile(r"^/(?![/\\])[^\s\\]*$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass
class ProxyState:
    """What the handlers share."""

    sites: SiteConfig
    routes: RouteTable
    sessions: SessionStore
    nc: NATS
    client: aiohttp.ClientSession
    tunnels: TunnelClients
    """Sessions for routes reached through a machine's tunnel (`Route.via_tunnel`)."""
    metrics: ProxyMetrics | None = None

    @property
    def cookie_name(self) -> str:
        return self.sites.cookie_name


STATE = web.AppKey("state", ProxyState)


def plain_response(status: int, text: str, request_id: str) -> web.Response:
    """A short fixed text for a person, with the request ID, never cached or referred."""
    return web.Response(
        status=status,
        text=text + "\n",
        content_type="text/plain",
        headers={
            "X-Request-ID": request_id,
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
        },
    )


def safe_next(value: str | None, default: str) -> str:
    """A same-site path to go to after entering, or `default` (open redirects refused)."""
    if not value:
        return default
    decoded = value
    for _ in range(3):  # encoded forms: %2F%2Fevil, %5Cevil, double encoding
        decoded = unquote(decoded)
    if not _SAFE_NEXT.match(value) or not _SAFE_NEXT.match(decoded):
        return default
    return value


async def handle(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    incoming = request.headers.get("X-Request-ID", "")
    request_id = incoming if _REQUEST_ID.match(incoming) else new_id("request")
    if telemetry.ON:  # the server span of OpenTelemetry's aiohttp middleware
        trace.get_current_span().set_attribute(telemetry.REQUEST_ID_ATTRIBUTE, request_id)
    workload_id = state.sites.workload_of(request.headers.get("Host"))
    with logs.bind(request_id=request_id, subject=workload_id):
        if not request.raw_path.startswith("/"):
            return plain_response(400, "Bad request: absolute URIs are not accepted.", request_id)
        if workload_id is None:
            return plain_response(404, "No such site.", request_id)
        route = state.routes.get(workload_id)
        if route is None:
            return plain_response(404, "This workload is not running.", request_id)
        if request.path == ENTER_PATH:
            return await _enter(request, state, workload_id, route.kind, request_id)
        session = state.sessions.get(request.cookies.get(state.cookie_name), workload_id)
        if session is None:
            return plain_response(403, "Open this workload from Einsora to get access.", request_id)
        if not _same_origin(request, state.sites.origin_of(workload_id)):
            log.warning("cross-origin request refused", extra={"method": request.method})
            return plain_response(403, "Cross-site requests are refused.", request_id)
        drop = (state.cookie_name, DASHBOARD_COOKIE)
        try:
            if route.kind is WorkloadKind.vm and vm_access.is_vm_path(request.path):
                relay = route.model_copy(update={"port": route.ports.get("console", route.port)})
                client = await state.tunnels.session(relay) if route.via_tunnel else state.client
                return await vm_access.handle(
                    request,
                    route,
                    client,
                    state.tunnels.directory,
                    session.closers.append,
                    request_id,
                )
            if route.kind is WorkloadKind.vm and "http" not in route.ports:
                return vm_access.no_web_ui(request_id)
            client = await state.tunnels.session(route) if route.via_tunnel else state.client
            if _is_websocket(request):
                if state.metrics is None:
                    return await forward_websocket(
                        request, client, route, drop, session.closers.append
                    )
                with state.metrics.websockets.track_inprogress():
                    return await forward_websocket(
                        request, client, route, drop, session.closers.append
                    )
            response = await forward_http(
                request, client, route, state.sites.origin_of(workload_id), drop
            )
        except aiohttp.ClientConnectorError as exc:
            if not route.via_tunnel:
                log.warning("workload unreachable", extra={"error": exc.__class__.__name__})
                return plain_response(502, "The workload did not answer.", request_id)
            # No socket (or nobody behind it): the hub has no tunnel from that machine now.
            log.warning("machine's tunnel not connected", extra={"machine": route.machine_id})
            return plain_response(502, f"{route.machine_id}'s tunnel is not connected.", request_id)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            log.warning("workload unreachable", extra={"error": exc.__class__.__name__})
            return plain_response(502, "The workload did not answer.", request_id)
        return response


def _is_websocket(request: web.Request) -> bool:
    return (
        request.headers.get("Upgrade", "").lower() == "websocket"
        and "upgrade" in request.headers.get("Connection", "").lower()
    )


def _same_origin(request: web.Request, site_origin: str) -> bool:
    """Safe methods pass; anything else, and every upgrade, must come from the site itself."""
    if request.method in SAFE_METHODS and not _is_websocket(request):
        return True
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin == site_origin
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None:
        return fetch_site == "same-origin"
    # No browser sends a cross-site upgrade without Origin; a non-browser client has no
    # ambient cookie to abuse.
    return not _is_websocket(request)


async def _enter(
    request: web.Request,
    state: ProxyState,
    workload_id: str,
    kind: WorkloadKind,
    request_id: str,
) -> web.StreamResponse:
    if request.method != "GET":
        # Only a GET redeems: link scanners and previews send HEAD (or worse) first, and a
        # ticket works once, so anything else is answered without asking the api.
        return _not_entered(request.method, request_id)
    ticket = request.query.get("ticket", "")
    if not ticket or len(ticket) > 256:
        return plain_response(403, "This access link is not valid.", request_id)
    reply = await _redeem(state.nc, ticket, workload_id, request_id)
    if not reply.ok:
        log.info("ticket refused", extra={"reason": reply.error})
        message = {
            "used": "This access link was already used. Open the workload again from Einsora.",
            "expired": "This access link has expired. Open the workload again from Einsora.",
        }.get(reply.error or "", "This access link is not valid.")
        status = 503 if reply.error == "unavailable" else 403
        return plain_response(status, message, request_id)
    session_id = state.sessions.create(workload_id, reply.tenant_id, reply.user_id)
    log.info("ticket redeemed", extra={"tenant": reply.tenant_id})
    default = {WorkloadKind.notebook: "/lab", WorkloadKind.vm: _vm_default(state, workload_id)}.get(
        kind, "/"
    )
    response = web.Response(
        status=303,
        headers={
            "Location": safe_next(request.query.get("next"), default),
            "X-Request-ID": request_id,
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
        },
    )
    response.set_cookie(
        state.cookie_name,
        session_id,
        path="/",
        httponly=True,
        samesite="Lax",
        secure=state.sites.cookie_secure,
    )
    return response


def _vm_default(state: ProxyState, workload_id: str) -> str:
    """A VM opens at its web UI when it serves one, else at its console."""
    route = state.routes.get(workload_id)
    return "/" if route is not None and "http" in route.ports else vm_access.CONSOLE_PATH


def _not_entered(method: str, request_id: str) -> web.Response:
    if method == "HEAD":
        response = plain_response(200, "Open this link in a browser to enter.", request_id)
    else:
        response = plain_response(405, "Use the link as it was given.", request_id)
    response.headers["Allow"] = "GET, HEAD"
    return response


async def _redeem(nc: NATS, ticket: str, workload_id: str, request_id: str) -> AccessRedeemReply:
    ask = AccessRedeemRequest(ticket=ticket, workload_id=workload_id, request_id=request_id)
    headers = {names.REQUEST_ID_HEADER: request_id}
    try:
        msg = await nc.request(
            names.ACCESS_REDEEM_SUBJECT, ask.to_bytes(), timeout=5, headers=headers
        )
        return AccessRedeemReply.from_bytes(msg.data)
    except Exception as exc:  # no responder, timeout, unreadable reply: refuse, never let in
        log.warning("ticket redemption unavailable", extra={"error": exc.__class__.__name__})
        return AccessRedeemReply(ok=False, error="unavailable")


def create_app(state: ProxyState) -> web.Application:
    middlewares = tracing_middlewares()
    if state.metrics is not None:
        middlewares.append(counting_middleware(state.metrics.requests, kind_of))
    app = web.Application(
        client_max_size=0, handler_args={"max_field_size": 16384}, middlewares=middlewares
    )
    app[STATE] = state
    app.router.add_route("*", "/{tail:.*}", handle)
    return app
