"""Joining a control plane: exchange a join token, once, for this machine's own credential.

`einsora agent join URL --token agt_…` posts the token with this host's name and its tunnel
host key to `URL/v1/machines/join`; the api answers with the machine's id, its long-lived
credential (`agk_…`) and where to connect. They are kept in `<data dir>/agent/enrolment.json`
(0600 in a 0700 dir, written atomically), which `einsora agent` then runs with. With
`--fingerprint sha256:<hex>`, the api's certificate is pinned instead of trusted through CAs.

Neither the join token nor the credential is ever logged, printed or put in a URL: the token
travels in the request body, the credential in an Authorization header.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import tempfile
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from einsora.agent.identity import check_machine_id
from einsora.common.errors import ConfigError, EinsoraError
from einsora.common.schemas import SharingLevel
from einsora.common.schemas.base import utcnow

ENROLMENT_FILE = "enrolment.json"
TUNNEL_HOST_KEY_FILE = "tunnel_host_key"
JOIN_TOKEN_PREFIX = "agt_"  # noqa: S105 (a prefix, not a secret)
TIMEOUT_S = 30.0


class MachineRevoked(EinsoraError):
    """The control plane revoked this machine: its agent stops for good."""

    code = "machine_revoked"

    def __init__(self, machine_id: str) -> None:
        super().__init__(
            f"machine revoked: the agent stops (machine {machine_id}; `einsora agent join` "
            "with a new token enrols it again)"
        )


class MachineUnknown(EinsoraError):
    """The api does not know this machine's credential (its enrolment is gone): no wait can
    cure that, so the agent stops; joining again is the way back."""

    code = "machine_unknown"

    def __init__(self, machine_id: str, api_url: str) -> None:
        super().__init__(
            f"the api at {api_url} does not know machine {machine_id}'s credential: the agent "
            "stops (`einsora agent join` with a new token enrols this machine again)"
        )


class Standing(StrEnum):
    """What the api says of this machine's credential (`GET /v1/machines/self`)."""

    enrolled = "enrolled"
    revoked = "revoked"
    unknown = "unknown"
    """The api answered that it knows no machine by this credential."""


class ApiRefused(EinsoraError):
    """The api answered the agent with an error (its code and message are the server's)."""


class TunnelEndpoint(BaseModel):
    """Where the agent dials its tunnel, and the hub's key it accepts."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int = Field(ge=1, le=65535)
    hub_key: str


class JoinReply(BaseModel):
    """What `POST /v1/machines/join` answers."""

    machine_id: str
    credential: SecretStr
    region: str
    owner_tenant_id: str
    sharing: SharingLevel
    nats_url: str
    nats_ca_pem: str | None = None
    tunnel: TunnelEndpoint | None = None
    api_url: str


class Enrolled(BaseModel):
    """This machine's enrolment as its agent keeps it: who it is and where to connect."""

    model_config = ConfigDict(frozen=True)

    machine_id: str
    credential: SecretStr
    """`agk_…`: the agent's NATS `auth_token` and its Bearer token at the api."""
    owner_tenant_id: str
    region: str
    sharing: SharingLevel
    api_url: str
    """The address the machine joined through (it answered, and the pin belongs to it)."""
    api_fingerprint: str | None = None
    """`sha256:<hex>` of the api's certificate, when it was pinned at join."""
    nats_url: str
    nats_ca_pem: str | None = None
    """The CA (PEM) trusted for `tls://` NATS; None: the system's CA trust."""
    tunnel: TunnelEndpoint | None = None
    hostname: str
    enrolled_at: datetime = Field(default_factory=utcnow)

    def nats_tls(self) -> ssl.SSLContext | None:
        """The TLS context for NATS when the control plane named its CA (None: defaults)."""
        if self.nats_ca_pem is None:
            return None
        try:
            return ssl.create_default_context(cadata=self.nats_ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"the NATS CA in the enrolment cannot be read: {exc}") from exc


# --- the enrolment file -------------------------------------------------------------------------


def enrolment_path(data_dir: Path) -> Path:
    return data_dir / "agent" / ENROLMENT_FILE


def tunnel_host_key_path(data_dir: Path) -> Path:
    return data_dir / "agent" / TUNNEL_HOST_KEY_FILE


def load_enrolment(data_dir: Path) -> Enrolled | None:
    """The stored enrolment; None when this machine never joined."""
    path = enrolment_path(data_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the enrolment at {path}: {exc}") from exc
    try:
        enrolled = Enrolled.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(
            f"the enrolment at {path} is not valid ({exc.error_count()} errors): join again "
            "with `einsora agent join URL --token … --force`"
        ) from exc
    check_machine_id(enrolled.machine_id)
    return enrolled


def save_enrolment(data_dir: Path, enrolled: Enrolled) -> Path:
    """Write the enrolment atomically, 0600 in a 0700 dir: a crash leaves the old or the new."""
    path = enrolment_path(data_dir)
    data: dict[str, Any] = enrolled.model_dump(mode="json")
    data["credential"] = enrolled.credential.get_secret_value()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        fd, partial = tempfile.mkstemp(prefix=f".{ENROLMENT_FILE}.", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power cut
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise ConfigError(f"cannot write the enrolment at {path}: {exc}") from exc
    return path


# --- talking to the api -------------------------------------------------------------------------


def parse_fingerprint(text: str) -> str:
    """`sha256:<hex>` (colons between bytes and upper case allowed), normalised."""
    value = text.strip().lower().removeprefix("sha256:").replace(":", "")
    try:
        digest = bytes.fromhex(value)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise ConfigError(
            f"--fingerprint {text!r} is not a SHA-256 fingerprint: give sha256:<64 hex digits>, "
            "as printed when the join token was made"
        )
    return "sha256:" + digest.hex()


def _ssl_for(url: str, fingerprint: str | None) -> aiohttp.Fingerprint | bool:
    if fingerprint is None:
        return True  # the system's CA trust for https
    if not url.lower().startswith("https://"):
        raise ConfigError(f"--fingerprint pins a TLS certificate, but {url} is not https")
    return aiohttp.Fingerprint(bytes.fromhex(parse_fingerprint(fingerprint).split(":", 1)[1]))


def _server_error(body: bytes) -> tuple[str, str]:
    """The error code and message of an api error body (`{"error": code, "message": …}`, or
    `{"error": {"code", "message"}}`)."""
    try:
        data = json.loads(body)
    except ValueError:
        return "", body[:300].decode(errors="replace").strip()
    if not isinstance(data, dict):
        return "", ""
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("code", "")), str(error.get("message", ""))
    return str(error or ""), str(data.get("message", ""))


async def _request(
    method: str,
    url: str,
    *,
    fingerprint: str | None,
    json_body: dict[str, Any] | None = None,
    bearer: SecretStr | None = None,
) -> tuple[int, bytes]:
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer.get_secret_value()}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session,
            session.request(
                method, url, json=json_body, headers=headers, ssl=_ssl_for(url, fingerprint)
            ) as response,
        ):
            return response.status, await response.read()
    except aiohttp.ServerFingerprintMismatch as exc:
        raise ConfigError(
            f"the certificate of {url} does not match the pinned fingerprint {fingerprint} "
            f"(it is sha256:{exc.got.hex()}): this may not be your control plane"
        ) from exc
    except aiohttp.ClientConnectorCertificateError as exc:
        raise ConfigError(
            f"the certificate of {url} is not trusted ({exc.certificate_error}): pin it with "
            "--fingerprint sha256:… as printed when the join token was made"
        ) from exc
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise EinsoraError(
            f"cannot reach the api at {url}: {exc or type(exc).__name__}",
            code="api_unreachable",
            retryable=True,
        ) from exc


async def exchange(
    api_url: str,
    token: str,
    *,
    hostname: str,
    tunnel_key: str,
    fingerprint: str | None = None,
) -> JoinReply:
    """`POST {api_url}/v1/machines/join`: the join token for this machine's id and credential."""
    url = api_url.rstrip("/") + "/v1/machines/join"
    status, body = await _request(
        "POST",
        url,
        fingerprint=fingerprint,
        json_body={"token": token, "hostname": hostname, "tunnel_key": tunnel_key},
    )
    if status != 201:
        code, message = _server_error(body)
        if status == 401:
            raise ApiRefused(
                f"{url} refused the join token: {message or 'unknown, used up or expired'}; "
                "make a new one with `einsora machines join-token`",
                code=code or "join_token_invalid",
            )
        raise ApiRefused(
            f"{url} answered {status}: {message or code or 'no reason given'}",
            code=code or "join_failed",
            retryable=status >= 500,
        )
    try:
        return JoinReply.model_validate_json(body)
    except ValidationError as exc:
        raise ApiRefused(
            f"{url} answered the join with a body this agent cannot read ({exc.error_count()} "
            "errors): is the agent's version that of the control plane?",
            code="join_reply_unreadable",
        ) from exc


async def is_revoked(enrolled: Enrolled) -> bool:
    """Ask the api (`GET /v1/machines/self`) whether this machine was revoked.

    True only when the api says so; False when it knows the machine as enrolled. Raises
    EinsoraError when it cannot tell (unreachable, 5xx, or the credential unknown there):
    the agent then keeps trying.
    """
    known = await standing(enrolled)
    if known is Standing.unknown:
        raise EinsoraError(
            f"the api at {enrolled.api_url} does not know machine {enrolled.machine_id}",
            code="api_unsure",
            retryable=True,
        )
    return known is Standing.revoked


async def standing(enrolled: Enrolled) -> Standing:
    """Ask the api (`GET /v1/machines/self`) what it knows of this machine's credential.

    Each answer is the api's own word: revoked (`machine_revoked`), unknown (401
    `unauthenticated`: no machine has this credential) or enrolled. Raises EinsoraError when it
    cannot tell (unreachable, 5xx, anything else): an outage, which the agent waits out.
    """
    url = enrolled.api_url.rstrip("/") + "/v1/machines/self"
    status, body = await _request(
        "GET", url, fingerprint=enrolled.api_fingerprint, bearer=enrolled.credential
    )
    if status == 200:
        try:
            revoked = bool(json.loads(body).get("revoked", False))
        except (ValueError, AttributeError) as exc:
            raise EinsoraError(f"{url} answered an unreadable body", retryable=True) from exc
        return Standing.revoked if revoked else Standing.enrolled
    code, message = _server_error(body)
    if code == "machine_revoked":
        return Standing.revoked
    if status == 401 and code == "unauthenticated":
        return Standing.unknown
    raise EinsoraError(
        f"{url} could not say whether machine {enrolled.machine_id} is enrolled: {status} "
        f"{code} {message}".strip(),
        code="api_unsure",
        retryable=True,
    )


# --- the whole join ----------------------------------------------------------------------------


def host_key_line(path: Path) -> str:
    """The tunnel host key's OpenSSH public line (the key made 0600 on first use)."""
    from einsora.agent.tunnel import make_host_key  # asyncssh: only when joining

    return make_host_key(path)


async def join(
    data_dir: Path,
    api_url: str,
    token: str,
    *,
    fingerprint: str | None = None,
    force: bool = False,
    hostname: str | None = None,
) -> Enrolled:
    """Exchange `token` at `api_url` and store the enrolment; refuses to replace one unless
    `force`."""
    token = token.strip()
    if not token.startswith(JOIN_TOKEN_PREFIX):
        raise ConfigError(
            f"a join token starts with {JOIN_TOKEN_PREFIX}: `einsora machines join-token` makes one"
        )
    existing = load_enrolment(data_dir)
    if existing is not None and not force:
        raise ConfigError(
            f"this machine already joined {existing.api_url} as {existing.machine_id}; "
            "--force joins again and replaces that enrolment"
        )
    pin = None if fingerprint is None else parse_fingerprint(fingerprint)
    _ssl_for(api_url, pin)  # refuse a pin on plain http before anything is made
    name = (hostname or socket.gethostname() or "machine")[:64]
    tunnel_key = host_key_line(tunnel_host_key_path(data_dir))
    reply = await exchange(api_url, token, hostname=name, tunnel_key=tunnel_key, fingerprint=pin)
    enrolled = Enrolled(
        machine_id=check_machine_id(reply.machine_id),
        credential=reply.credential,
        owner_tenant_id=reply.owner_tenant_id,
        region=reply.region,
        sharing=reply.sharing,
        api_url=api_url.rstrip("/"),
        api_fingerprint=pin,
        nats_url=reply.nats_url,
        nats_ca_pem=reply.nats_ca_pem,
        tunnel=reply.tunnel,
        hostname=name,
    )
    save_enrolment(data_dir, enrolled)
    return enrolled
