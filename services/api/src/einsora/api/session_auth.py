"""Dashboard sessions on the request path: the cookie a signed-in browser sends, checked as API
tokens are, and the CSRF defence of what it changes (ADR-0019).

A request that carries `Authorization` is an API token's, whatever cookie comes with it: the
bearer path (`auth.authenticate`) is untouched. Only a request without one is looked at for the
session cookie: `__Host-einsora_session` where the dashboard is served over TLS, which only its
own origin can set, and `einsora_session` over plain HTTP, where browsers refuse the prefix. A
site under the same parent domain (a workload's) can toss a cookie of the plain name in beside
ours; over TLS it is not read, and over HTTP a request with two differing session cookies is
refused (400) rather than one of them taken, which would sign the victim in as whoever tossed
it (login CSRF). Its secret has 256 random bits, so, like a token's, only its SHA-256 is
stored and a lookup is one indexed query; a verified session is remembered in the same
`VerifiedTokens` cache as tokens, keyed by that digest, so signing out drops it here and on every
other replica through the revocations the tokens use (`ApiContext.revoked`).

A session ends when its user signs out, `session_idle_hours` after it was last used, or
`session_max_days` after it began. `last_seen_at` is written at most once a minute.

State changes made with a session need, besides the cookie (host-only, HttpOnly,
`SameSite=Strict`), an `X-CSRF-Token` header that only the dashboard's own script can know: an
HMAC of the session's secret, handed to it when it signs in and by `GET /v1/sessions/current`.
A request whose `Origin` is another site's is refused before that, as is any sign-in from one
(`require_same_origin`), so nobody can sign a browser into an account that is not theirs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from starlette.types import Scope

from einsora.api import models as m
from einsora.api.auth import (
    Principal,
    Verified,
    VerifiedTokens,
    lookup_by_digest,
    secret_hash,
)
from einsora.api.errors import BadRequest, Forbidden, Unauthenticated
from einsora.api.store import Store
from einsora.common.sites import dashboard_cookie

SESSION_PREFIX = "ses_"
_SECRET_RE = re.compile(r"^ses_[A-Za-z0-9_-]{43}$")
CSRF_HEADER = "X-CSRF-Token"
_CSRF_HEADER = CSRF_HEADER.lower().encode()
_CSRF_CONTEXT = b"einsora-dashboard-csrf/v1"
LAST_SEEN_RESOLUTION = timedelta(seconds=60)
"""`last_seen_at` is written at most this often per session: a GET should not be a write."""


def new_session_secret() -> str:
    return SESSION_PREFIX + secrets.token_urlsafe(32)


def csrf_token(secret: str) -> str:
    """The session's CSRF token: an HMAC of its secret, so it is never stored, and known only
    to whoever was told it (the dashboard's script, from a same-origin answer)."""
    mac = hmac.new(secret.encode(), _CSRF_CONTEXT, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def session_cookie(scope: Scope, public_url: str | None = None) -> str | None:
    """The value of the dashboard's session cookie in the request (its `__Host-` name when
    served over TLS), or None; a request that carries two that differ is refused (400)."""
    wanted = dashboard_cookie(served_over_tls(scope, public_url))
    values: set[str] = set()
    for name, value in scope["headers"]:
        if name != b"cookie":
            continue
        text: str = value.decode("latin-1")
        for part in text.split(";"):
            key, sep, found = part.strip().partition("=")
            if sep and key == wanted:
                values.add(found.strip().strip('"'))
    if len(values) > 1:
        raise BadRequest(
            f"this request carries two different {wanted} cookies, so neither is trusted: "
            "another site under this one's parent domain (a workload's site can) set one. "
            "Clear this site's cookies and sign in again; over HTTPS this cannot happen",
            code="ambiguous_session_cookie",
        )
    return values.pop() if values else None


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def require_same_origin(scope: Scope, public_url: str | None = None) -> None:
    """Refuse (403) a request a browser sent from another site: its `Origin` (browsers send it
    on every POST, PUT, PATCH and DELETE) must name the host it was sent to. A request without
    one (the CLI, curl) is no browser's and passes; `Sec-Fetch-Site`, where sent, must not say
    `cross-site` or `same-site` either (a sibling subdomain is another site's code)."""
    fetch_site = _header(scope, b"sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise Forbidden(
            f"a {fetch_site} request may not use or open a dashboard session",
            code="cross_site_request",
        )
    origin = _header(scope, b"origin")
    if origin is None:
        return
    host = _header(scope, b"host")
    allowed = {host} if host else set()
    if public_url:
        allowed.add(urlsplit(public_url).netloc)
    if origin == "null" or urlsplit(origin).netloc not in allowed:
        raise Forbidden(
            "this request comes from another site (its Origin is not this dashboard's); "
            "it may not use or open a dashboard session",
            code="cross_site_request",
        )


def check_csrf(scope: Scope, secret: str) -> None:
    """A state change with a session needs the session's CSRF token in `X-CSRF-Token`."""
    sent = _header(scope, _CSRF_HEADER)
    if sent is None or not hmac.compare_digest(sent.encode(), csrf_token(secret).encode()):
        raise Forbidden(
            f"a change made with a dashboard session needs its {CSRF_HEADER} header "
            "(the dashboard sends it; reload the page if this persists)",
            code="csrf_failed",
        )


_LOOKUP = lookup_by_digest(
    m.sessions,
    m.sessions.c.id,
    m.sessions.c.expires_at,
    m.sessions.c.last_seen_at,
    m.sessions.c.ended_at,
    m.sessions.c.operator.label("session_operator"),
)


async def authenticate_session(
    store: Store,
    secret: str,
    cache: VerifiedTokens,
    *,
    now: datetime,
    idle: timedelta,
) -> Principal:
    """The principal of a session cookie's secret, or Unauthenticated saying why not."""
    if not _SECRET_RE.match(secret):
        raise Unauthenticated("malformed session cookie: sign in again", code="session_ended")
    digest = secret_hash(secret)
    verified = cache.get(digest)
    if verified is None:
        verified = await _look_up(store, digest)
        cache.remember(digest, verified)
    if verified.expires_at is not None and verified.expires_at <= now:
        raise Unauthenticated(
            f"your session ended at {verified.expires_at.isoformat()}: sign in again",
            code="session_ended",
        )
    seen = verified.last_used_at
    if seen is not None and now - seen >= idle:
        raise Unauthenticated(
            f"your session ended after {idle.total_seconds() / 3600:g} hours unused: sign in again",
            code="session_ended",
        )
    if seen is None or now - seen >= LAST_SEEN_RESOLUTION:
        await _touch(store, verified.principal.token_id, now)
        cache.remember(digest, replace(verified, last_used_at=now))
    return verified.principal


async def _look_up(store: Store, digest: str) -> Verified:
    read_at = time.monotonic()
    row: Any = await store.query(lambda conn: conn.execute(_LOOKUP, {"digest": digest}).first())
    if row is None or row.ended_at is not None:
        raise Unauthenticated("you are signed out: sign in again", code="session_ended")
    principal = Principal(
        token_id=row.id,
        user_id=row.user_id,
        username=row.username,
        tenant_id=row.tenant_id,
        tenant_name=row.tenant_name,
        role=row.role,
        is_operator=bool(row.is_operator) and bool(row.session_operator),
    )
    return Verified(principal, row.expires_at, row.last_seen_at, read_at)


async def _touch(store: Store, session_id: str, now: datetime) -> None:
    touch = sa.update(m.sessions).where(m.sessions.c.id == session_id).values(last_seen_at=now)
    await store.run(lambda conn: conn.execute(touch))


def cookie_header(secret: str, *, max_age_s: int, secure: bool) -> str:
    """`Set-Cookie` for a session: host-only (no Domain), HttpOnly, SameSite=Strict, and
    when the dashboard is served over TLS, Secure and named `__Host-…` (which needs all of
    Secure, no Domain and path /)."""
    parts = [
        f"{dashboard_cookie(secure)}={secret}",
        "Path=/",
        f"Max-Age={max_age_s}",
        "HttpOnly",
        "SameSite=Strict",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def cleared_cookie_header(*, secure: bool) -> str:
    """`Set-Cookie` that makes the browser forget the session cookie."""
    return cookie_header("", max_age_s=0, secure=secure)


def served_over_tls(scope: Scope, public_url: str | None) -> bool:
    """Whether the dashboard is served over TLS: the request came over it, or the api's public
    address is an https one (a front that terminates TLS)."""
    return scope.get("scheme") == "https" or bool(public_url and public_url.startswith("https:"))


def request_host(headers: Mapping[str, str]) -> str:
    """The host name (without port) the caller reached the api at."""
    host = headers.get("host", "127.0.0.1")
    return urlsplit(f"//{host}").hostname or "127.0.0.1"
