"""Where the CLI finds the API and its token.

API URL: `--api`, else `EINSORA_API`, else the local Solo (`http://127.0.0.1:<api port>`).
Token: `EINSORA_TOKEN`, else the one saved by `einsora login`, else the local Solo's
`owner.token`. The token is never printed and never put in a URL.

The local Solo's ports and data dir are read from `EINSORA_*` as `Settings` reads them, but
without it: `Settings` imports pydantic, which costs `einsora ls` more than the rest of its run.
A test checks that both read the same environment the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from einsora.common.errors import ConfigError

DEFAULT_PORTS = {"api_port": 8080, "gateway_port": 8082}
"""The defaults of the `Settings` fields the CLI reads."""


def credentials_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "einsora" / "credentials.json"


@dataclass(frozen=True)
class ClientConfig:
    """The API URL and token the CLI uses, and where each came from."""

    api_url: str
    token: str | None
    token_source: str


def local_port(field: str) -> int:
    """`Settings().<field>` for a port field the CLI needs (`api_port`, `gateway_port`)."""
    raw = _setting(field)
    if raw is None:
        return DEFAULT_PORTS[field]
    try:
        port = int(raw.strip())
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ConfigError(
            f"EINSORA_{field.upper()} must be a port number (0 to 65535), not {raw!r}"
        )
    return port


def local_data_dir() -> Path:
    """`Settings().data_dir`: `EINSORA_DATA_DIR`, else
    `${XDG_DATA_HOME:-~/.local/share}/einsora`."""
    raw = _setting("data_dir")
    if raw:
        return Path(raw)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "einsora"


def _setting(field: str) -> str | None:
    # Settings matches EINSORA_<FIELD> in any case (pydantic-settings' default); so do we.
    wanted = f"EINSORA_{field}".upper()
    return next((v for k, v in os.environ.items() if k.upper() == wanted), None)


def resolve(api_flag: str | None) -> ClientConfig:
    saved = _load_saved()
    api_url = (
        api_flag
        or os.environ.get("EINSORA_API")
        or saved.get("api")
        or f"http://127.0.0.1:{local_port('api_port')}"
    )
    if token := os.environ.get("EINSORA_TOKEN"):
        return ClientConfig(api_url, token, "EINSORA_TOKEN")
    if token := saved.get("token"):
        return ClientConfig(api_url, token, str(credentials_file()))
    owner = local_data_dir() / "owner.token"
    if owner.exists():
        return ClientConfig(api_url, owner.read_text().strip(), str(owner))
    return ClientConfig(api_url, None, "none")


def save_login(api_url: str, token: str) -> Path:
    """Save credentials with mode 0600 (created so, never widened then narrowed)."""
    path = credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"api": api_url, "token": token}, f)
    os.chmod(path, 0o600)
    return path


def _load_saved() -> dict[str, str]:
    try:
        data = json.loads(credentials_file().read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}
