"""An endpoint's model: `spec.model` resolved to a local file or directory, checked before any
runtime loads it.

`spec.model` is an absolute local path, a `file://` URI or an `https://` URI. A download is
bounded (`einsora.agent.downloads`: public addresses unless the machine's owner allows a
network, a size cap, its progress in the workload's reason) and kept in the agent's `models/`
directory, named by a hash of its redacted URI and its basename, and reused when it is there.
Whatever its source, the file goes through `einsora.common.weights.check_file` (GGUF or
safetensors headers, never a pickle) and a refusal is a StartFailed whose reason names the
check, so the workload fails saying why.

A URI can carry a secret (a password in its userinfo, a signed query string): it is used for
the request only, and only its redacted form reaches a reason, a log line or a file name.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from urllib.parse import unquote, urlsplit

from einsora.agent import downloads
from einsora.agent.drivers.base import StartFailed
from einsora.common import weights


async def resolve(
    model: str,
    cache_dir: Path,
    *,
    policy: downloads.DownloadPolicy | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Path:
    """The checked local file (or directory) of `model`, downloading an https URI into
    `cache_dir` first (as the machine owner's `policy` allows: by default, from public addresses
    only); StartFailed saying why it is refused. `ssl_context` replaces the system's trusted
    certificates (a private CA)."""
    shown = weights.redact(model)
    if weights.is_uri(model):
        scheme = model.split("://", 1)[0].lower()
        if scheme == "file":
            path = _file_path(model, shown)
        elif scheme == "https":
            _refuse_name(model)  # a .bin is refused before it is fetched
            policy = policy or downloads.DownloadPolicy()
            path = await downloads.download(
                model, cache_dir, policy.model_cap, policy, ssl_context=ssl_context
            )
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
