"""The auth callout: the server asks, for each agent that connects with a machine credential,
who it is; this answers with a short-lived user JWT carrying exactly that machine's permissions.

The server sends an `authorization_request` JWT (signed by the server's own nkey) on
`$SYS.REQ.USER.AUTH` in the callout's account. The responder checks it, hands the client's raw
token to `authorize` (the api looks its hash up in the store), and answers with an
`authorization_response` signed by the issuer account key, wrapping a user JWT for the app
account. It never logs or echoes a token, and a refusal says nothing about why. It records which
connections it admitted for each identity, so a revocation can kick them at once; the JWT's
expiry is the backstop. A machine's grant (`Permissions.machine`) places its session in the
machines' account, whose limits bound it (ADR-0028). Only nkeys (and PyNaCl, nkeys' own
ed25519) and nats-py: the callout and JWT packages on PyPI were checked and are not worth
depending on (nats-auth.md, §3).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nacl.exceptions
import nacl.signing
import nats.errors
import nkeys
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from einsora.common.bus import names
from einsora.common.bus.accounts import (
    APP_ACCOUNT,
    MACHINE_ACCOUNT,
    MACHINE_MAX_PAYLOAD,
    MACHINE_MAX_SUBSCRIPTIONS,
)
from einsora.common.bus.identities import AUTH_REQUEST_SUBJECT, Identity, Permissions
from einsora.common.failures import outlives

log = logging.getLogger("einsora.bus.callout")

REQUEST_AUDIENCE = "nats-authorization-request"
MAX_PAYLOAD = 1024 * 1024
"""The largest message a session that is not a machine's may publish (the server's own)."""
_RESPONSE_TTL_NS = 120 * 10**9
"""How long a granted reply permission lasts (the server's default for `allow_responses`)."""
_REFUSED = "not authorized"
KICK_TRIES = 3
KICK_RETRY_S = 0.25
"""The first wait before a kick the server did not answer is sent again (doubling after)."""
_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


@dataclass(frozen=True)
class Grant:
    """What a credential maps to: the identity, its permissions, and how long the JWT lives."""

    identity: str
    permissions: Permissions
    expires_s: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_jwt(claims: dict[str, Any], signer: nkeys.KeyPair) -> str:
    """A NATS JWT: `b64url(header).b64url(claims).b64url(ed25519 signature)`."""
    body = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{body}.{_b64(signer.sign(body.encode()))}"


def verify_jwt(token: str) -> dict[str, Any]:
    """The claims of a NATS JWT whose signature is valid for its own `iss`; ValueError if not."""
    try:
        header, claims, sig = token.split(".")
        if json.loads(_unb64(header)) != _HEADER:
            raise ValueError("not a NATS JWT")
        decoded: dict[str, Any] = json.loads(_unb64(claims))
        raw = base64.b32decode(decoded["iss"] + "=" * (-len(decoded["iss"]) % 8))
        key, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
        if len(key) != 33 or nkeys.crc16(key) != crc:
            raise ValueError("issuer is not an nkey")
        nacl.signing.VerifyKey(key[1:]).verify(f"{header}.{claims}".encode(), _unb64(sig))
    except (ValueError, KeyError, TypeError, nacl.exceptions.BadSignatureError) as exc:
        # Only the kind: a request's text includes the client's credential.
        raise ValueError(f"invalid JWT ({type(exc).__name__})") from exc
    return decoded


def _user_claims(grant: Grant, user_nkey: str, account: str, issuer: str) -> dict[str, Any]:
    p = grant.permissions
    # A machine's limits, said in its JWT too, for a server that reads them (operator mode).
    # nats-server 2.15 ignores a callout JWT's `payload`, `subs` and `data` in this layout: its
    # machines' account's limits are what hold, and no server limits a data rate (`data` is
    # left unlimited; the scheduler and the api read a machine's rewrites at a bounded pace).
    nats: dict[str, Any] = {
        "pub": {"allow": list(p.publish)},
        "sub": {"allow": list(p.subscribe)},
        "subs": MACHINE_MAX_SUBSCRIPTIONS if p.machine else -1,
        "data": -1,
        "payload": MACHINE_MAX_PAYLOAD if p.machine else MAX_PAYLOAD,
        "type": "user",
        "version": 2,
    }
    if p.publish_deny:
        nats["pub"]["deny"] = list(p.publish_deny)
    if p.allow_responses:
        nats["resp"] = {"max": 1, "ttl": _RESPONSE_TTL_NS}
    now = time.time()
    return {
        "jti": secrets.token_hex(16),
        "iat": int(now),
        "exp": int(now + grant.expires_s),
        "iss": issuer,
        "sub": user_nkey,
        "aud": MACHINE_ACCOUNT if p.machine else account,
        "name": grant.identity,
        "nats": nats,
    }


class AuthCallout:
    """The responder on `$SYS.REQ.USER.AUTH`, signing as `issuer` for `account` (a machine's
    grant: for the machines' account)."""

    def __init__(
        self,
        issuer: Identity,
        authorize: Callable[[str], Awaitable[Grant | None]],
        *,
        account: str = APP_ACCOUNT,
    ) -> None:
        self._signer = nkeys.from_seed(issuer.seed.encode())
        self._issuer = issuer.public_key
        self._authorize = authorize
        self._account = account
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._granted: dict[str, dict[tuple[str, int], float]] = {}
        """identity → {(server id, client id): expiry}: what a kick must close."""
        self._kicked_at: dict[str, float] = {}
        """identity → when it was last kicked: a grant decided across a kick is refused."""

    async def start(self, nc: NATS) -> None:
        """Answer requests on `nc`, a connection as the callout identity in the AUTH account."""
        self._sub = await nc.subscribe(AUTH_REQUEST_SUBJECT, cb=self._on_request)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_request(self, msg: Msg) -> None:
        # One task per request, so a slow store lookup holds up no other connect.
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        try:
            request = verify_jwt(msg.data.decode())
            claims = request["nats"]
            server_id, user_nkey = claims["server_id"]["id"], claims["user_nkey"]
            cid, host = int(claims["client_info"]["id"]), claims["client_info"].get("host")
            connect_opts = claims.get("connect_opts") or {}
            token, name = connect_opts.get("auth_token"), connect_opts.get("name")
            if (
                request["iss"] != server_id
                or request.get("aud") != REQUEST_AUDIENCE
                or claims.get("type") != "authorization_request"
            ):
                raise ValueError("not an authorization request from its server")
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            # Nothing trustworthy to answer to: the server times the client out and refuses it.
            log.warning("auth callout: request ignored", extra={"error": str(exc)})
            return
        grant: Grant | None = None
        who = {"cid": cid, "client": host, "client_name": name}
        if isinstance(token, str) and token:
            asked = time.monotonic()
            try:
                grant = await self._authorize(token)
            except Exception as exc:
                # Only the type: an error's text could quote the credential.
                log.error("authorize failed", extra={**who, "error": type(exc).__name__})
            if grant is not None and self._kicked_at.get(grant.identity, 0.0) >= asked:
                who["identity"] = grant.identity
                grant = None  # revoked while it was being decided
        response: dict[str, Any] = {"type": "authorization_response", "version": 2}
        if grant is None:
            response["error"] = _REFUSED
            log.warning("bus credential refused", extra=who)
        else:
            user = _user_claims(grant, user_nkey, self._account, self._issuer)
            response["jwt"] = encode_jwt(user, self._signer)
            now, known = time.time(), self._granted.get(grant.identity, {})
            live = {k: exp for k, exp in known.items() if exp >= now}  # expired ones are gone
            self._granted[grant.identity] = live | {(server_id, cid): user["exp"]}
            log.info(
                "bus credential granted",
                extra={**who, "identity": grant.identity, "expires_s": grant.expires_s},
            )
        envelope = {"jti": secrets.token_hex(16), "iat": int(time.time()), "iss": self._issuer}
        envelope |= {"sub": user_nkey, "aud": server_id, "nats": response}
        try:
            await msg.respond(encode_jwt(envelope, self._signer).encode())
        except nats.errors.Error as exc:
            log.warning("auth callout: no answer sent", extra={**who, "error": str(exc)})

    async def kick(self, identity: str, sys_nc: NATS) -> int:
        """Close every connection this callout admitted as `identity`; how many were closed.

        `sys_nc` is a connection in the system account. The caller revokes the credential first
        (so `authorize` refuses it): a reconnect is then refused.
        """
        self._kicked_at[identity] = time.monotonic()
        now = time.time()
        connections = [k for k, exp in self._granted.pop(identity, {}).items() if exp >= now]

        async def one(server_id: str, cid: int) -> bool:
            subject, body = names.server_kick_subject(server_id), json.dumps({"cid": cid}).encode()
            error = ""
            for attempt in range(KICK_TRIES):
                try:
                    reply = json.loads((await sys_nc.request(subject, body, 2.0)).data)
                except nats.errors.ConnectionClosedError as exc:
                    error = str(exc) or type(exc).__name__
                    break  # no system connection: trying again cannot help
                except Exception as exc:
                    # A busy server's answer came late, or not at all: the connection would
                    # otherwise live on until its JWT expires. A refusal or an unreadable
                    # answer is tried again too, as few times.
                    if not outlives(exc, nats.errors.Error, ValueError):
                        raise
                    error = str(exc) or type(exc).__name__
                    if attempt + 1 < KICK_TRIES:
                        await asyncio.sleep(KICK_RETRY_S * 2**attempt)
                    continue
                if isinstance(reply, dict) and "error" not in reply:
                    return True
                # Most often the connection had closed already; said, in case it had not.
                log.info(
                    "kick refused by the server",
                    extra={"identity": identity, "cid": cid, "reply": str(reply)[:200]},
                )
                return False
            log.warning("kick failed", extra={"identity": identity, "cid": cid, "error": error})
            return False

        done = await asyncio.gather(*(one(s, c) for s, c in connections))
        log.info("bus identity kicked", extra={"identity": identity, "connections": sum(done)})
        return sum(done)


__all__ = ["AuthCallout", "Grant", "encode_jwt", "verify_jwt"]
