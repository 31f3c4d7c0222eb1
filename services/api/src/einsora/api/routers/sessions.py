"""`/v1/sessions`: the dashboard's sign-in (a password, a one-time link, an invitation link),
its session, sign out; `/v1/sign-in-links` and `/v1/me/password` (ADR-0019).

A session's secret travels only in its cookie (host-only, HttpOnly, `SameSite=Strict`, `Secure`
under TLS), set by the answer that begins it; the answer's body carries the CSRF token the
dashboard's script sends back with every change. Sign-ins from another site are refused
(`session_auth.require_same_origin`), and so are sign-ins at a workload's site.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from einsora.api.context import ApiContext
from einsora.api.deps import (
    AUTH_ERRORS,
    BODY_ERRORS,
    SESSION_SCOPE_KEY,
    Ctx,
    JsonBody,
    Me,
    errors,
    no_content,
    operation_id,
    reply,
)
from einsora.api.errors import Forbidden, NotFound
from einsora.api.passwords import SignInThrottle
from einsora.api.schemas.sessions import (
    InvitationSignUp,
    LinkSignIn,
    PasswordChange,
    PasswordSignIn,
    SessionOut,
    SignInLinkCreate,
    SignInLinkCreated,
)
from einsora.api.services import sessions, sign_in_links
from einsora.api.session_auth import (
    cleared_cookie_header,
    cookie_header,
    request_host,
    require_same_origin,
    served_over_tls,
)
from einsora.common.sites import SiteConfig

router = APIRouter(tags=["sessions"], generate_unique_id_function=operation_id)

NO_STORE = {"Cache-Control": "no-store"}
SIGN_IN_ERRORS = (*BODY_ERRORS, 401, 403, 429)


def _idle(ctx: ApiContext) -> timedelta:
    return timedelta(hours=ctx.settings.session_idle_hours)


def _max_age(ctx: ApiContext) -> timedelta:
    return timedelta(days=ctx.settings.session_max_days)


def _gateway_url(request: Request, ctx: ApiContext) -> str:
    settings = ctx.settings
    if settings.gateway_public_url:
        return settings.gateway_public_url
    return f"http://{request_host(request.headers)}:{settings.gateway_port}/v1"


def _secure(request: Request, ctx: ApiContext) -> bool:
    return served_over_tls(request.scope, ctx.settings.public_url)


def _refuse_elsewhere(request: Request, ctx: ApiContext) -> None:
    """A sign-in must come from the dashboard's own page: not from another site, and not at a
    workload's site (whose pages run the workload's code)."""
    require_same_origin(request.scope, ctx.settings.public_url)
    if SiteConfig.from_settings(ctx.settings).workload_of(request.headers.get("host")):
        raise Forbidden("a workload's site is not the dashboard: sign in at the dashboard")


def _began(request: Request, ctx: ApiContext, began: sessions.Began) -> Response:
    out = sessions.began_out(began, idle=_idle(ctx), gateway_url=_gateway_url(request, ctx))
    cookie = cookie_header(
        began.secret,
        max_age_s=int(_max_age(ctx).total_seconds()),
        secure=_secure(request, ctx),
    )
    return reply(out, 201, {**NO_STORE, "Set-Cookie": cookie})


def _throttle(request: Request) -> SignInThrottle:
    throttle: SignInThrottle = request.app.state.ctx.sign_in_throttle
    return throttle


@router.post(
    "/v1/sessions",
    summary="Sign in to the dashboard with a username and password (sets the session cookie)",
    response_model=SessionOut,
    status_code=201,
    responses=errors(*SIGN_IN_ERRORS),
)
async def create_session(
    request: Request,
    ctx: Ctx,
    body: Annotated[PasswordSignIn, Depends(JsonBody(PasswordSignIn))],
) -> Response:
    _refuse_elsewhere(request, ctx)
    address = request.client.host if request.client is not None else "unknown"
    began = await sessions.sign_in_with_password(
        ctx.store,
        body,
        throttle=_throttle(request),
        address=address,
        now=ctx.clock(),
        max_age=_max_age(ctx),
    )
    return _began(request, ctx, began)


@router.post(
    "/v1/sessions/link",
    summary="Sign in to the dashboard with a one-time sign-in link's code (sets the cookie)",
    response_model=SessionOut,
    status_code=201,
    responses=errors(*SIGN_IN_ERRORS),
)
async def create_session_from_link(
    request: Request, ctx: Ctx, body: Annotated[LinkSignIn, Depends(JsonBody(LinkSignIn))]
) -> Response:
    _refuse_elsewhere(request, ctx)
    began = await sessions.sign_in_with_link(
        ctx.store, body.code, now=ctx.clock(), max_age=_max_age(ctx)
    )
    return _began(request, ctx, began)


@router.post(
    "/v1/sessions/invitation",
    summary="A new user opens their invitation link and chooses a password: the user, their "
    "membership and a dashboard session are made (sets the cookie)",
    response_model=SessionOut,
    status_code=201,
    responses=errors(*SIGN_IN_ERRORS, 404, 409),
)
async def create_session_from_invitation(
    request: Request,
    ctx: Ctx,
    body: Annotated[InvitationSignUp, Depends(JsonBody(InvitationSignUp))],
) -> Response:
    _refuse_elsewhere(request, ctx)
    began = await sessions.join_with_invitation(
        ctx.store, body, now=ctx.clock(), max_age=_max_age(ctx)
    )
    return _began(request, ctx, began)


def _secret(request: Request) -> str:
    secret: str | None = request.scope.get(SESSION_SCOPE_KEY)
    if secret is None:
        raise NotFound("this request is not a dashboard session's (it used an API token)")
    return secret


@router.get(
    "/v1/sessions/current",
    summary="The dashboard session this request runs in, with its CSRF token",
    response_model=SessionOut,
    responses=errors(*AUTH_ERRORS, 404),
)
async def get_session(request: Request, call: Me) -> Response:
    secret = _secret(request)
    ctx = call.ctx
    out = await sessions.current(
        ctx.store, call.me, secret, idle=_idle(ctx), gateway_url=_gateway_url(request, ctx)
    )
    return reply(out, headers=NO_STORE)


@router.delete(
    "/v1/sessions/current",
    summary="Sign out: the session ends on the server at once, and its cookie is cleared",
    status_code=204,
    responses=errors(*AUTH_ERRORS, 404),
)
async def end_session(request: Request, call: Me) -> Response:
    _secret(request)
    ctx = call.ctx
    await sessions.end(ctx.store, call.me, ctx.clock())
    await ctx.revoked([call.me.token_id])  # refused from the next request on, on every replica
    answer = no_content()
    answer.headers["Set-Cookie"] = cleared_cookie_header(secure=_secure(request, ctx))
    return answer


@router.post(
    "/v1/sign-in-links",
    summary="A one-time link (valid 15 minutes by default) that signs its opener in to the "
    "dashboard as you, in this tenant (`einsora dashboard` prints one)",
    response_model=SignInLinkCreated,
    status_code=201,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS),
)
async def create_sign_in_link(
    call: Me, body: Annotated[SignInLinkCreate, Depends(JsonBody(SignInLinkCreate))]
) -> Response:
    made = await sign_in_links.mint_link(call.ctx.store, call.me, body, call.ctx.clock())
    return reply(made, 201, NO_STORE)


@router.put(
    "/v1/me/password",
    summary="Set or change your own dashboard password (changing it needs the current one); "
    "your other dashboard sessions end",
    status_code=204,
    responses=errors(*AUTH_ERRORS, *BODY_ERRORS),
)
async def set_password(
    call: Me, body: Annotated[PasswordChange, Depends(JsonBody(PasswordChange))]
) -> Response:
    ctx = call.ctx
    ended = await sessions.set_password(ctx.store, call.me, body, ctx.clock())
    if ended:
        await ctx.revoked(ended)
    return no_content()
