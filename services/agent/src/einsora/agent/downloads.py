"""Downloads are bounded: a model or a VM image fetched over https reaches only the public
internet (unless the machine's owner allows a network), stops at a size, and says how far it got.

A spec's `https://` URI is a tenant's word, fetched by the agent from inside its machine's
network. Unchecked, it would reach the machine's loopback, its LAN and the cloud's metadata
service (169.254.169.254), fill its disk, and its failures would tell which ports answer. So:

- **Addresses.** Every address a host's name resolves to must be public: global unicast, and
  not loopback, private, shared, link-local, unspecified, multicast or reserved (an IPv4
  address inside an IPv6 one, mapped, 6to4 or NAT64, is judged as itself), unless it lies in a
  network the machine's owner allows (`EINSORA_AGENT_DOWNLOAD_ALLOW`, on the machine itself:
  never the control plane's choice). The resolver hands aiohttp exactly the addresses it
  checked, with no cache, so the connection goes to a checked address and a name that resolves
  again differently gains nothing. Redirects are followed here, one hop at a time, each one's
  scheme and addresses checked again.
- **Size.** A download stops at its cap (`EINSORA_AGENT_MODEL_DOWNLOAD_MAX_GIB`,
  `EINSORA_AGENT_IMAGE_DOWNLOAD_MAX_GIB`): a Content-Length above it is refused before the body,
  a body that runs past it is cut. A download is streamed to a partial file, renamed once
  complete: a partial file never stays behind.
- **Words.** A host that is not allowed, refuses, cannot be reached or does not answer gives the
  user one and the same reason; which it was goes to the agent's log. No connection is ever
  made to an address that is not allowed, so only an allowed host can tell more (an HTTP status,
  a TLS failure).
- **Progress.** While it runs, the workload's observed reason says how much has come
  ("downloading model: 1.2 of 4.7 GiB"): the supervisor sets where it goes (`reporting_to`)
  around a start.

A URI can carry a secret (a password in its userinfo, a signed query string): it is used for
the request only; only its redacted form reaches a reason, a log line or a file name.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from pathlib import Path, PurePosixPath
from typing import Final
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from einsora.agent.drivers.base import StartFailed
from einsora.common import weights
from einsora.common.errors import ConfigError
from einsora.common.settings import Settings

log = logging.getLogger("einsora.agent")

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

GIB: Final = 1 << 30
CHUNK: Final = 1 << 20
CONNECT_TIMEOUT_S: Final = 30.0
READ_TIMEOUT_S: Final = 120.0
"""The longest a download may stall between two reads before it is given up."""
MAX_REDIRECTS: Final = 10
PROGRESS_EVERY_S: Final = 1.0
"""How often a download's progress may change the workload's reason."""

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_NAT64 = ip_network("64:ff9b::/96")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Cap:
    """The most one kind of download may bring, and the owner's setting that says so."""

    what: str
    """What is downloaded, as a reason names it ("model", "VM image")."""
    max_bytes: int
    setting: str


@dataclass(frozen=True)
class DownloadPolicy:
    """What the machine's owner lets downloads reach and bring (`of` their settings)."""

    allow: tuple[Network, ...] = ()
    """Networks reachable although not public (a mirror on the machine's own network)."""
    model_max_bytes: int = 64 * GIB
    image_max_bytes: int = 64 * GIB

    @classmethod
    def of(cls, settings: Settings) -> DownloadPolicy:
        """The owner's policy; a ConfigError naming a network that is not one."""
        allow: list[Network] = []
        for item in settings.agent_download_allow.split(","):
            if not item.strip():
                continue
            try:
                allow.append(ip_network(item.strip(), strict=False))
            except ValueError:
                raise ConfigError(
                    f"invalid setting: agent_download_allow: {item.strip()!r} is not a network "
                    "(a CIDR such as 10.20.0.0/16; EINSORA_AGENT_DOWNLOAD_ALLOW)"
                ) from None
        return cls(
            tuple(allow),
            math.ceil(settings.agent_model_download_max_gib * GIB),
            math.ceil(settings.agent_image_download_max_gib * GIB),
        )

    @property
    def model_cap(self) -> Cap:
        return Cap("model", self.model_max_bytes, "EINSORA_AGENT_MODEL_DOWNLOAD_MAX_GIB")

    @property
    def image_cap(self) -> Cap:
        return Cap("VM image", self.image_max_bytes, "EINSORA_AGENT_IMAGE_DOWNLOAD_MAX_GIB")

    def permits(self, address: Address) -> bool:
        """Whether a download may connect to `address`."""
        inner = _embedded(address)
        if any(a in n for a in (address, inner) if a is not None for n in self.allow):
            return True
        return is_public(address) and (inner is None or is_public(inner))


def is_public(address: Address) -> bool:
    """A global unicast address (Python counts multicast as global; here it is not)."""
    return address.is_global and not (address.is_multicast or address.is_reserved)


def _embedded(address: Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4 or NAT64), which it reaches."""
    if not isinstance(address, IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


# --- progress --------------------------------------------------------------------------------

_reporter: ContextVar[Callable[[str], None] | None] = ContextVar(
    "einsora_download_reporter", default=None
)


@contextmanager
def reporting_to(report: Callable[[str], None]) -> Iterator[None]:
    """Within this block, a download says how far it got through `report` (the supervisor's
    starting reason)."""
    token = _reporter.set(report)
    try:
        yield
    finally:
        _reporter.reset(token)


_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _unit(n: float) -> tuple[str, int]:
    return next(((unit, scale) for unit, scale in _UNITS if n >= scale), ("bytes", 1))


def size_text(n: float) -> str:
    """`n` bytes for a person: "512 bytes", "1.0 MiB", "4.7 GiB"."""
    unit, scale = _unit(n)
    return f"{n:.0f} bytes" if scale == 1 else f"{n / scale:.1f} {unit}"


def _of(done: int, total: int) -> str:
    """Progress as "1.2 of 4.7 GiB": both in the unit of the total."""
    _, scale = _unit(total)
    amount = f"{done:.0f}" if scale == 1 else f"{done / scale:.1f}"
    return f"{amount} of {size_text(total)}"


class _Progress:
    """Reports a download's progress at most every PROGRESS_EVERY_S, when its words change."""

    def __init__(self, what: str, total: int | None) -> None:
        self.report = _reporter.get()
        self.what = what
        self.total = total
        self.last_at = -math.inf
        self.last = ""

    def __call__(self, done: int, *, now: bool = False) -> None:
        if self.report is None:
            return
        at = time.monotonic()
        if not now and at - self.last_at < PROGRESS_EVERY_S:
            return
        amount = _of(done, self.total) if self.total else f"{size_text(done)} so far"
        text = f"downloading {self.what}: {amount}"
        if text != self.last:
            self.last, self.last_at = text, at
            self.report(text)


# --- addresses -------------------------------------------------------------------------------


class _Unreachable(Exception):
    """A host a download may not or could not reach; `detail` is for the agent's log only."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(detail)
        self.host = host
        self.detail = detail


def _check(host: str, address: Address, policy: DownloadPolicy) -> None:
    if not policy.permits(address):
        raise _Unreachable(host, f"{host} is {address}: not public, and not an allowed network")


class _CheckedResolver(AbstractResolver):
    """Resolves a name, checks every address it has and hands aiohttp exactly those."""

    def __init__(self, policy: DownloadPolicy) -> None:
        self.policy = policy
        self.resolver = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.resolver.resolve(host, port, family)
        for each in found:
            _check(host, ip_address(each["host"]), self.policy)
        return found

    async def close(self) -> None:
        await self.resolver.close()


def _check_literal(host: str, policy: DownloadPolicy) -> None:
    """An address written in the URI (aiohttp resolves none, so it is checked here)."""
    try:
        address = ip_address(host)
    except ValueError:
        return  # a name: the resolver checks what it resolves to
    _check(host, address, policy)


def _unreachable(shown: str, host: str) -> StartFailed:
    return StartFailed(
        f"downloading {shown} failed: {host} cannot be reached from this machine (it refused or "
        "did not answer, or it is not a public address and this machine's owner allows no other)"
    )


# --- the download ----------------------------------------------------------------------------


def cache_name(uri: str) -> str:
    """The file name a download of `uri` is kept under: a hash of its redacted form (the same
    file under a freshly signed URL is the same name) and its basename, extension included."""
    shown = weights.redact(uri)
    base = PurePosixPath(unquote(urlsplit(shown).path)).name or "model"
    base = _UNSAFE_NAME.sub("_", base)[-120:]
    digest = hashlib.sha256(shown.encode()).hexdigest()[:16]
    return f"{digest}-{base}"


async def download(
    uri: str,
    cache_dir: Path,
    cap: Cap,
    policy: DownloadPolicy,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> Path:
    """The local copy of `uri` in `cache_dir`, fetched when it is not there yet (its content
    unchecked: the caller checks it), or StartFailed saying why not. `ssl_context` replaces the
    system's trusted certificates (a private CA)."""
    shown = weights.redact(uri)
    target = cache_dir / cache_name(uri)
    if target.is_file():
        return target
    partial = cache_dir / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        await asyncio.to_thread(cache_dir.mkdir, mode=0o700, parents=True, exist_ok=True)
        log.info("downloading", extra={"what": cap.what, "uri": shown, "to": str(target)})
        received = await _fetch(uri, partial, cap, policy, shown, ssl_context)
        os.replace(partial, target)
        log.info("downloaded", extra={"what": cap.what, "uri": shown, "bytes": received})
    except _Unreachable as exc:
        log.warning(
            "a download's host cannot be reached",
            extra={"uri": shown, "host": exc.host, "detail": exc.detail},
        )
        raise _unreachable(shown, exc.host) from None
    except aiohttp.ClientSSLError as exc:
        raise StartFailed(
            f"downloading {shown} failed: the TLS connection to {exc.host} failed (its "
            "certificate is not trusted here?)"
        ) from None
    except aiohttp.ClientPayloadError:
        raise StartFailed(
            f"downloading {shown} failed: the connection broke off mid-file"
        ) from None
    except TimeoutError:
        raise StartFailed(f"downloading {shown} failed: no data for {READ_TIMEOUT_S:g} s") from None
    except aiohttp.ClientError as exc:
        raise StartFailed(f"downloading {shown} failed: {type(exc).__name__}") from None
    except OSError as exc:
        raise StartFailed(
            f"the download of {shown} could not be stored in {cache_dir}: {exc.strerror or exc}"
        ) from None
    finally:
        partial.unlink(missing_ok=True)
    return target


async def _fetch(
    uri: str,
    partial: Path,
    cap: Cap,
    policy: DownloadPolicy,
    shown: str,
    ssl_context: ssl.SSLContext | None,
) -> int:
    """Follow `uri`'s redirects, each hop checked, and save its body to `partial`."""
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
    )
    connector = aiohttp.TCPConnector(resolver=_CheckedResolver(policy), use_dns_cache=False)
    url = URL(uri)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for _ in range(MAX_REDIRECTS + 1):
            if url.scheme != "https":
                raise StartFailed(f"downloading {shown} was redirected off https; refused")
            host = url.raw_host or ""
            _check_literal(host, policy)
            try:
                async with session.get(
                    url, allow_redirects=False, ssl=ssl_context if ssl_context is not None else True
                ) as response:
                    if response.status in _REDIRECTS:
                        url = _next_hop(url, response, shown)
                        continue
                    if response.status != 200:
                        status = f"HTTP {response.status} {response.reason or ''}".rstrip()
                        raise StartFailed(f"downloading {shown} failed: {status}")
                    return await _save(response, partial, cap, shown)
            except aiohttp.ClientSSLError:
                raise  # an allowed host that answered: its TLS failure is worth saying
            except (
                aiohttp.ClientConnectorError,
                aiohttp.ConnectionTimeoutError,
                aiohttp.InvalidURL,
            ) as exc:
                raise _Unreachable(host, f"{type(exc).__name__}: {_why(exc)}") from None
    raise StartFailed(f"downloading {shown} failed: more than {MAX_REDIRECTS} redirects")


def _next_hop(url: URL, response: aiohttp.ClientResponse, shown: str) -> URL:
    location = response.headers.get("Location", "")
    try:
        following = url.join(URL(location))
    except ValueError:
        following = None
    if not location or following is None or following.raw_host is None:
        raise StartFailed(
            f"downloading {shown} failed: HTTP {response.status} without a usable Location"
        )
    log.info(
        "a download is redirected",
        extra={"uri": shown, "to": weights.redact(str(following))},
    )
    return following


def _why(exc: Exception) -> str:
    """What went wrong with a connection, for the log: the OS's words, never the URI."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"{exc.host}:{exc.port}: {exc.os_error.strerror or type(exc.os_error).__name__}"
    return "no answer" if isinstance(exc, TimeoutError) else "an invalid address"


async def _save(response: aiohttp.ClientResponse, partial: Path, cap: Cap, shown: str) -> int:
    """The body into `partial`, within `cap`; returns its size."""
    expected = response.content_length
    over = (
        f"over this machine's limit of {size_text(cap.max_bytes)} for a {cap.what} "
        f"download (its owner sets {cap.setting})"
    )
    if expected is not None and expected > cap.max_bytes:
        raise StartFailed(f"{shown} is {size_text(expected)}, {over}; not downloaded")
    progress = _Progress(cap.what, expected)
    progress(0, now=True)
    received = 0
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        async for chunk in response.content.iter_chunked(CHUNK):
            received += len(chunk)
            if received > cap.max_bytes:
                raise StartFailed(f"downloading {shown} was cut: it runs {over}")
            await asyncio.to_thread(f.write, chunk)  # a disk write must not stall the agent
            progress(received)
    if expected is not None and received != expected:
        raise StartFailed(f"downloading {shown} stopped after {received:,} of {expected:,} bytes")
    progress(received, now=True)
    return received
