"""Connecting to NATS: reconnect for ever once connected, but fail fast and clearly at start-up.

nats-py with unlimited reconnects would wait silently for ever on a server that is not there;
a person starting a service wants to be told which URL did not answer.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import nats
from nats.aio.client import Client as NATS

from einsora.common.bus.identities import Identity, inbox_prefix, load_identity
from einsora.common.errors import BusUnavailable, ConfigError

log = logging.getLogger("einsora.bus")


async def connect(
    url: str,
    *,
    name: str,
    inbox_prefix: str | None = None,
    credentials: Identity | None = None,
    startup_timeout: float = 5.0,
) -> NATS:
    """Connect to `url`, reconnecting for ever after the first success.

    With `credentials`, the client proves it holds that identity's nkey seed. Raises
    BusUnavailable naming the URL when no connection is made within `startup_timeout`, and
    ConfigError when the server refuses the credentials.
    """
    state: dict[str, bool] = {"reported": False}
    holder: list[NATS] = []

    seen_errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        if len(seen_errors) < 20:
            seen_errors.append(str(exc))
        # The default callback prints a traceback per attempt; one line per outage is enough.
        if not state["reported"]:
            log.warning("nats connection problem", extra={"url": url, "error": str(exc)})
            state["reported"] = True

    async def on_disconnected() -> None:
        if holder and (holder[0].is_closed or holder[0].is_draining):
            return  # closed on purpose
        log.warning("nats disconnected; reconnecting", extra={"url": url})

    async def on_reconnected() -> None:
        state["reported"] = False
        log.info("nats reconnected", extra={"url": url})

    options: dict[str, object] = {
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        "connect_timeout": min(2.0, startup_timeout),
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
    }
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    if credentials is not None:
        options["nkeys_seed_str"] = credentials.seed
    try:
        nc = await asyncio.wait_for(nats.connect(url, **options), timeout=startup_timeout)
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        # nats-py retries a refused CONNECT until the deadline: its errors tell why.
        reason = " ".join([str(exc), *seen_errors]).lower()
        if "authorization" in reason or "authentication" in reason:
            who = credentials.name if credentials is not None else "a client without credentials"
            raise ConfigError(
                f"NATS at {url} refused {who}: check EINSORA_NATS_CREDENTIALS_DIR (Solo keeps "
                "each service's credential in <data dir>/bus)"
            ) from exc
        raise BusUnavailable(
            f"cannot reach NATS at {url} within {startup_timeout:g} s: is nats-server running "
            "there? Set EINSORA_NATS_URL (or --nats) to the right address."
        ) from exc
    holder.append(nc)
    return nc


async def connect_as(
    url: str, identity: str, credentials_dir: Path | None, *, name: str | None = None
) -> NATS:
    """Connect as one bus identity: its own inbox prefix, and its seed when credentials are on."""
    credentials = None if credentials_dir is None else load_identity(credentials_dir, identity)
    return await connect(
        url,
        name=name or f"einsora-{identity}",
        inbox_prefix=inbox_prefix(identity),
        credentials=credentials,
    )
