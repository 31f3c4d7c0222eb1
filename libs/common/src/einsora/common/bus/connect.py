"""Connecting to NATS: reconnect for ever once connected, but fail fast and clearly at start-up.

nats-py with unlimited reconnects would wait silently for ever on a server that is not there;
a person starting a service wants to be told which URL did not answer. A refused credential is
told apart from an unreachable server (`CredentialRefused` against `BusUnavailable`), at once
rather than after the start-up timeout: a machine's agent asks the api whether it was revoked
before it tries again, and a network failure needs no such question.

nats-py closes a connection for good when the server ends it over its credential ("User
Authentication Expired", a revoked or removed user), and retries a refused reconnect for ever.
A caller that passes `on_closed` runs its own outer loop, so for it a refused reconnect closes
the connection too: both cases then reach that loop the same way. nats-py closes an ended
session from a task of its own, and that close can fail before it calls back (writing to the
socket the server closed): such a caller also watches `is_closed`, which is set first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from einsora.common.bus.identities import Identity, inbox_prefix, load_identity
from einsora.common.bus.reconnects import reconnects
from einsora.common.errors import BusUnavailable, ConfigError

log = logging.getLogger("einsora.bus")

CONNECT_TIMEOUT_S = 3.0


class CredentialRefused(ConfigError):
    """NATS refused this client's credential (unknown, removed, revoked or expired): unlike a
    network failure, trying again unchanged only helps if the server's mind changes."""

    code = "credential_refused"


def is_refusal(error: BaseException | str) -> bool:
    """Whether a nats-py error (or its text) is the server refusing the credential."""
    text = str(error).lower()
    return "authorization" in text or "authentication" in text


def shown_url(url: str) -> str:
    """`url` without a user or password in it, fit for a log line or a message."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))


async def connect(
    url: str,
    *,
    name: str,
    inbox_prefix: str | None = None,
    credentials: Identity | None = None,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    on_closed: Callable[[], Awaitable[None]] | None = None,
    startup_timeout: float = 5.0,
    report_start: bool = True,
) -> NATS:
    """Connect to `url` (or to any node of a cluster: URLs separated by commas), reconnecting
    for ever after the first success.

    With `credentials`, the client proves it holds that identity's nkey seed; with `token`, it
    sends it as its `auth_token` (a machine credential, which Lab's auth callout maps to the
    machine's permissions). `tls` is the context for a `tls://` server (None: the system's CA
    trust). `on_closed` is awaited once the connection is closed for good, whoever closed it
    (nats-py on an expired or revoked credential, a refused reconnect, or the caller); only
    when nats-py's own close fails is it not (`nc.is_closed` then says so).

    Raises BusUnavailable naming the URL when no connection is made within `startup_timeout`,
    and CredentialRefused (a ConfigError) as soon as the server refuses the credential.
    `report_start=False` logs nothing before the first success: a caller that tries again and
    again logs its outage once itself.
    """
    where = shown_url(url)
    state: dict[str, bool] = {"reported": False, "told_closed": False}
    holder: list[NATS] = []
    refused = asyncio.Event()
    closing: set[asyncio.Task[None]] = set()
    seen_errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        if len(seen_errors) < 20:
            seen_errors.append(str(exc))
        if is_refusal(exc):
            if not holder:
                refused.set()  # at start-up: the caller is told now, not at the deadline
            elif on_closed is not None and not holder[0].is_closed:
                # A refused reconnect: nats-py would retry it for ever. Closing hands it to
                # the caller's own loop. Not awaited here: this runs inside the reconnect task,
                # which close() cancels.
                task = asyncio.create_task(close_refused(holder[0]))
                closing.add(task)
                task.add_done_callback(closing.discard)
        # The default callback prints a traceback per attempt; one line per outage is enough.
        if not state["reported"] and (holder or report_start):
            log.warning("nats connection problem", extra={"url": where, "error": str(exc)})
            state["reported"] = True

    async def on_disconnected() -> None:
        if holder and (holder[0].is_closed or holder[0].is_draining):
            return  # closed (on purpose, or for good: on_closed says so)
        reconnects(nc).disconnected()
        log.warning("nats disconnected; reconnecting", extra={"url": where})

    async def on_reconnected() -> None:
        state["reported"] = False
        reconnects(nc).reconnected()
        log.info("nats reconnected", extra={"url": where})

    async def on_closed_for_good() -> None:
        if holder and on_closed is not None and not state["told_closed"]:
            state["told_closed"] = True
            await on_closed()

    async def close_refused(nc: NATS) -> None:
        # nats-py's close sends what the client still holds before it calls `closed_cb`, to a
        # socket the server has just closed: it raises then (ConnectionResetError), and the
        # caller's loop, told nothing, would wait for ever (issue 35, F3). The connection is
        # closed all the same, so the caller is told here whatever close did.
        await close_quietly(nc)
        await on_closed_for_good()

    # Any: nats-py types its timeouts as int, and they are fractions of a second here.
    options: dict[str, Any] = {
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        # Longer than the server's auth callout timeout (2 s): a connect the callout never
        # answered is refused then, and a shorter wait would take that for no server at all.
        "connect_timeout": min(CONNECT_TIMEOUT_S, startup_timeout),
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "closed_cb": on_closed_for_good,
    }
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    if credentials is not None:
        options["nkeys_seed_str"] = credentials.seed
    if token is not None:
        options["token"] = token
    if tls is not None:
        options["tls"] = tls
    nc = NATS()
    # A cluster's nodes, comma-separated (Lab): nats-py tries each, and fails over between them.
    servers: str | list[str] = [u.strip() for u in url.split(",")] if "," in url else url
    attempt = asyncio.ensure_future(nc.connect(servers, **options))
    refusal = asyncio.ensure_future(refused.wait())
    try:
        await asyncio.wait(
            {attempt, refusal}, timeout=startup_timeout, return_when="FIRST_COMPLETED"
        )
    except BaseException:
        await _abandon(nc, attempt)  # the caller was cancelled: no connection left behind
        raise
    finally:
        refusal.cancel()
    failure: BaseException | None = None
    if attempt.done() and not attempt.cancelled():
        failure = attempt.exception()
        if failure is None:
            holder.append(nc)
            return nc
    await _abandon(nc, attempt)
    # nats-py retries a refused CONNECT until the deadline: its errors tell why.
    if refused.is_set() or is_refusal(" ".join([str(failure or ""), *seen_errors])):
        raise _refusal(where, credentials, token) from failure
    raise BusUnavailable(
        f"cannot reach NATS at {where} within {startup_timeout:g} s: is nats-server running "
        "there? Set EINSORA_NATS_URL (or --nats) to the right address."
    ) from failure


async def close_quietly(nc: NATS | None) -> None:
    """Close a client at shutdown, whatever became of its server: nats-py's close writes what
    it still holds to a transport that uvloop may have closed already (a RuntimeError) or
    waits on a flush that cannot end. A service stopping must not fail on that (nothing is
    lost: every write it waits for has come or failed by then)."""
    if nc is None or nc.is_closed:
        return
    with contextlib.suppress(NatsError, OSError, TimeoutError, RuntimeError):
        await nc.close()


async def _abandon(nc: NATS, attempt: asyncio.Future[None]) -> None:
    """Stop a connection attempt and close what it made."""
    attempt.cancel()
    with contextlib.suppress(asyncio.CancelledError, NatsError, OSError, TimeoutError):
        await attempt
    with contextlib.suppress(NatsError, OSError, TimeoutError):
        await nc.close()


def _refusal(where: str, credentials: Identity | None, token: str | None) -> CredentialRefused:
    if token is not None:
        # No advice to join again here: the server refuses too while the api, whose auth
        # callout vouches for machines, is down; the agent asks the api which it is.
        return CredentialRefused(
            f"NATS at {where} refused this machine's credential (revoked, expired or unknown, "
            "or the control plane that vouches for machines is down)"
        )
    who = credentials.name if credentials is not None else "a client without credentials"
    return CredentialRefused(
        f"NATS at {where} refused {who}: check EINSORA_NATS_CREDENTIALS_DIR (Solo keeps "
        "each service's credential in <data dir>/bus)"
    )


async def connect_as(
    url: str,
    identity: str,
    credentials_dir: Path | None,
    *,
    name: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> NATS:
    """Connect as one bus identity: its own inbox prefix, and its seed when credentials are on."""
    credentials = None if credentials_dir is None else load_identity(credentials_dir, identity)
    return await connect(
        url,
        name=name or f"einsora-{identity}",
        inbox_prefix=inbox_prefix(identity),
        credentials=credentials,
        tls=tls,
    )


def tls_trusting(certificate: Path | None) -> ssl.SSLContext | None:
    """A client TLS context that trusts exactly `certificate` (the server's own, PEM), whoever
    issued it and whatever names it carries: the control plane's services reach their server
    at 127.0.0.1 or at the address it listens on. None without a certificate (plain NATS)."""
    if certificate is None:
        return None
    try:
        context = ssl.create_default_context(cafile=str(certificate))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot read the NATS TLS certificate {certificate}: {exc}; check "
            "EINSORA_NATS_TLS_CERT"
        ) from exc
    context.check_hostname = False  # the certificate itself is pinned instead
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a leaf may be its own anchor
    return context
