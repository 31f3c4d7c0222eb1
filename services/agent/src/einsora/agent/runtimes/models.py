"""An endpoint's model: `spec.model` resolved to a local file or directory, checked before any
runtime loads it.

`spec.model` is an absolute local path, a `file://` URI or an `https://` URI. A download is
streamed to a temporary file in the agent's `models/` directory and renamed once complete, so a
cut download is never taken for a model; it is named by a hash of its redacted URI and its
basename, and reused when it is there. Whatever its source, the file goes through
`einsora.common.weights.check_file` (GGUF or safetensors headers, never a pickle) and a refusal
is a StartFailed whose reason names the check, so the workload fails saying why.

A URI can carry a secret (a password in its userinfo, a signed query string): it is used for
the request only, and only its redacted form reaches a reason, a log line or a file name.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import ssl
import uuid
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import aiohttp

from einsora.agent.drivers.base import StartFailed
from einsora.common import weights

log = logging.getLogger("einsora.agent")

CHUNK = 1 << 20
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 120.0
"""The longest a download may stall between two reads before it is given up."""

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


async def resolve(
    model: str, cache_dir: Path, *, ssl_context: ssl.SSLContext | None = None
) -> Path:
    """The checked local file (or directory) of `model`, downloading an https URI into
    `cache_dir` first; StartFailed saying why it is refused. `ssl_context` replaces the system's
    trusted certificates (a private CA)."""
    shown = weights.redact(model)
    if weights.is_uri(model):
        scheme = model.split("://", 1)[0].lower()
        if scheme == "file":
            path = _file_path(model, shown)
        elif scheme == "https":
            _refuse_name(model)  # a .bin is refused before it is fetched
            path = await download(model, cache_dir, ssl_context=ssl_context)
        else:
            raise StartFailed(
                f"spec.model {shown}: {scheme}:// is not supported; give an absolute path, a "
                "file:// URI or an https:// URI"
            )
    else:
        path = Path(model)
        if not path.is_absolute():
            raise StartFailed(
                f"spec.model {shown} is a relative path; give an absolute path on the machine, a "
                "file:// URI or an https:// URI"
            )
    await asyncio.to_thread(check, path)
    return path


def check(path: Path) -> None:
    """StartFailed, naming the check, unless `path` is a model file a runtime may load."""
    try:
        weights.check_file(path)
    except weights.WeightsRefused as exc:
        raise StartFailed(f"the model was refused: {exc.message}") from None


def _refuse_name(model: str) -> None:
    try:
        weights.check_name(model)
    except weights.WeightsRefused as exc:
        raise StartFailed(f"the model was refused: {exc.message}") from None


def _file_path(uri: str, shown: str) -> Path:
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise StartFailed(
            f"spec.model {shown} names a file on another host ({parts.netloc}); a file:// URI "
            "must name a file on this machine"
        )
    return Path(unquote(parts.path))


def cache_name(uri: str) -> str:
    """The file name a download of `uri` is kept under: a hash of its redacted form (the same
    file under a freshly signed URL is the same name) and its basename, extension included."""
    shown = weights.redact(uri)
    base = PurePosixPath(unquote(urlsplit(shown).path)).name or "model"
    base = _UNSAFE_NAME.sub("_", base)[-120:]
    digest = hashlib.sha256(shown.encode()).hexdigest()[:16]
    return f"{digest}-{base}"


async def download(uri: str, cache_dir: Path, *, ssl_context: ssl.SSLContext | None = None) -> Path:
    """The local copy of `uri` in `cache_dir`, fetched when it is not there yet (unchecked:
    `resolve` checks it)."""
    shown = weights.redact(uri)
    target = cache_dir / cache_name(uri)
    if target.is_file():
        return target
    partial = cache_dir / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        await asyncio.to_thread(cache_dir.mkdir, mode=0o700, parents=True, exist_ok=True)
        log.info("downloading a model", extra={"model": shown, "to": str(target)})
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
        )
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(uri, ssl=ssl_context if ssl_context is not None else True) as response,
        ):
            if response.url.scheme != "https":
                raise StartFailed(f"downloading {shown} was redirected off https; refused")
            if response.status != 200:
                status = f"HTTP {response.status} {response.reason or ''}".rstrip()
                raise StartFailed(f"downloading {shown} failed: {status}")
            received = await _save(response, partial)
            expected = response.content_length
            if expected is not None and received != expected:
                raise StartFailed(
                    f"downloading {shown} stopped after {received:,} of {expected:,} bytes"
                )
        os.replace(partial, target)
        log.info("downloaded a model", extra={"model": shown, "bytes": received})
    except aiohttp.ClientError as exc:
        raise StartFailed(f"downloading {shown} failed: {_describe(exc)}") from None
    except TimeoutError:
        raise StartFailed(f"downloading {shown} failed: no data for {READ_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise StartFailed(
            f"the download of {shown} could not be stored in {cache_dir}: {exc.strerror or exc}"
        ) from None
    finally:
        partial.unlink(missing_ok=True)
    return target


async def _save(response: aiohttp.ClientResponse, partial: Path) -> int:
    received = 0
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        async for chunk in response.content.iter_chunked(CHUNK):
            await asyncio.to_thread(f.write, chunk)  # a disk write must not stall the agent
            received += len(chunk)
    return received


def _describe(exc: aiohttp.ClientError) -> str:
    """Why a request failed, in words that hold no part of the URI beyond its host."""
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"the TLS connection to {exc.host} failed (its certificate is not trusted here?)"
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = exc.os_error.strerror or "refused"
        return f"cannot connect to {exc.host}:{exc.port} ({why})"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the connection broke off mid-file"
    return type(exc).__name__
