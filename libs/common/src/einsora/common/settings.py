"""Settings: one typed object, built once at start-up from `EINSORA_*` variables and flags.

Nothing in Einsora reads the environment at import time; a command builds `Settings()` (or
`Settings(**overrides)` from its flags) and passes it down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from einsora.common.errors import ConfigError
from einsora.common.schemas.base import what_is_wrong


def default_data_dir() -> Path:
    """`${XDG_DATA_HOME:-~/.local/share}/einsora`."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "einsora"


class Settings(BaseSettings):
    """Everything a service or the agent needs to know about where things are."""

    model_config = SettingsConfigDict(env_prefix="EINSORA_", extra="ignore")

    nats_url: str | None = Field(
        default=None,
        description="An external NATS server. Unset: services use nats://127.0.0.1:<nats_port>, "
        "and Solo starts its own server there.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the store; unset: SQLite at <data_dir>/einsora.db",
    )
    data_dir: Path = Field(default_factory=default_data_dir)
    nats_credentials_dir: Path | None = Field(
        default=None,
        description="Where each bus identity's nkey seed lives (`<identity>.nk`, mode 0600). "
        "Unset: connect without credentials (a server without authorization, as in tests). "
        "Solo sets it to <data_dir>/bus and makes the seeds (ADR-0009).",
    )
    region: str = "local"
    # Issue 34, N1 (ADR-0026): who may enrol machines reached directly.
    direct_machine_networks: str = Field(
        default="",
        description="Networks (CIDRs, comma-separated) from which a tenant admin's machines may "
        "join to be reached directly (`tunnel: false`): the control plane then connects to the "
        "address a machine joined from. Unset: only the operator makes tokens for direct "
        "machines",
    )
    gpu_inventory: Path | None = Field(
        default=None,
        description="The agent reads this machine's NVIDIA GPUs from this NVML snapshot file "
        "(JSON, as `einsora agent gpus --json` prints; a recording or hand-written) instead of "
        "NVML: tests, and seeing what Einsora makes of a machine. Unset: NVML",
    )
    catalog: Path | None = Field(
        default=None,
        description="The operator's catalog file (JSON): classes added to the built-in ones or "
        "replacing them by name, `hide` (classes never offered) and `automatic` (false: a GPU "
        "no class names is not offered). Every service reads this one setting: the api "
        "(what /v1/classes offers), the scheduler (where it places), Solo and the dashboard. "
        "Unset: the built-in classes, and an automatic class for each GPU model or MIG "
        "profile they do not name",
    )
    machine_owner_tenant: str | None = Field(
        default=None,
        description="The tenant that owns this cell's machines until they are enrolled with "
        "owners: only its workloads run on a machine whose drivers are all weak isolation "
        "(`process`). Unset: no tenant's do. Solo sets it to the owner's tenant.",
    )
    community_pool: bool = Field(
        default=False,
        description="This instance runs a community pool: machines shared with `community` take "
        "any tenant's workloads (with strong isolation). Unset: community sharing counts as "
        "invite-only",
    )
    # Issue 34, N9: the drivers a machine may claim come from the operator.
    sim_machines: bool = Field(
        default=False,
        description="This cell allows sim machines (the `sim` driver runs nothing): for tests, "
        "benchmarks and Solo's own sim agent. Unset: a machine that reports `sim` has that "
        "driver ignored, so no workload is placed there with it. Solo sets it when it runs "
        "a sim agent",
    )
    api_port: int = Field(default=8080, ge=0, le=65535)
    proxy_port: int = Field(default=8081, ge=0, le=65535)
    gateway_port: int = Field(default=8082, ge=0, le=65535)
    nats_port: int = Field(default=4222, ge=0, le=65535)
    bind_host: str = "127.0.0.1"
    proxy_domain: str = Field(
        default="localhost",
        description="Workload sites are w-<id>.<proxy_domain> (a wildcard DNS name in Lab)",
    )
    proxy_tls: bool = Field(
        default=False, description="Sites are served over TLS (by a front that terminates it)"
    )
    tunnel_port: int = Field(
        default=8083,
        ge=0,
        le=65535,
        description="Where agents of machines that accept no inbound connection dial their "
        "tunnel (ADR-0015); 0: any free port",
    )
    tunnel_host: str | None = Field(
        default=None, description="The tunnel's listen address; unset: bind_host"
    )
    tunnel_sockets_dir: Path | None = Field(
        default=None,
        description="Where the tunnel hub serves one unix socket per tunnelled route (the "
        "proxy and the gateway connect there); unset: <data_dir>/tunnel/sockets. A unix "
        "socket's path is at most 107 bytes",
    )
    nats_listen: str | None = Field(
        default=None,
        description="Solo: where its embedded NATS also listens for machines that join from "
        "elsewhere (`host` or `host:port`), with the auth callout on; unset: 127.0.0.1 only",
    )
    nats_tls_cert: Path | None = Field(
        default=None, description="TLS certificate (PEM) for NATS clients; with nats_tls_key"
    )
    nats_tls_key: Path | None = Field(default=None, description="TLS key (PEM) for NATS")
    agent_nats_url: str | None = Field(
        default=None,
        description="The NATS URL machines elsewhere dial (join replies name it); unset: the "
        "services' own. Solo sets it from --listen",
    )
    public_url: str | None = Field(
        default=None,
        description="The api's address as machines elsewhere reach it (join responses name "
        "it); unset: http://<bind_host>:<api_port>",
    )
    log_level: str = "INFO"
    log_format: str = Field(
        default="auto",
        pattern="^(auto|human|json|text)$",
        description="auto: human lines on a terminal, JSON lines otherwise; text = human",
    )

    # Issue 34, N13 (no file oracle) and N14 (downloads are bounded).
    model_dirs: str = Field(
        default="",
        pattern=r"^(/[^:]*(:/[^:]*)*)?$",
        description="The api: directories (absolute, separated by ':') where it checks an "
        "endpoint's spec.model at launch (Solo, or a disk it shares with the machines). A path "
        "anywhere else is the user's word, checked by the agent that runs it. Unset: the api "
        "looks at no local path",
    )
    agent_download_allow: str = Field(
        default="",
        description="The agent: networks (CIDR, comma-separated) model and VM-image downloads "
        "may reach although they are not public (loopback, private, link-local...), e.g. "
        "10.20.0.0/16 for a mirror on the machine's own network: its owner's choice. Unset: "
        "public addresses only",
    )
    agent_model_download_max_gib: float = Field(
        default=64.0,
        gt=0,
        description="The agent: the largest model download, in GiB (larger: refused, or cut)",
    )
    agent_image_download_max_gib: float = Field(
        default=64.0,
        gt=0,
        description="The agent: the largest VM image, kernel or initrd download, in GiB",
    )
    # Issue 35, item 2 (ADR-0029): agents fence themselves.
    agent_fence_after_s: float = Field(
        default=90.0,
        ge=0,
        description="The agent: seconds without an acknowledged write to the bus after which "
        "it stops the workloads the control plane may run elsewhere (a fallback chain, an "
        "endpoint's replicas, or spec.disconnect = stop). Keep it below the scheduler's "
        "--lost-after minus its reaction and the stop's grace; 0: never",
    )

    @property
    def model_dir_paths(self) -> tuple[Path, ...]:
        """`model_dirs`, each normalised (`..` and `.` resolved by name, not on disk)."""
        return tuple(Path(os.path.normpath(d)) for d in self.model_dirs.split(":") if d)

    @property
    def effective_tunnel_sockets_dir(self) -> Path:
        return self.tunnel_sockets_dir or self.data_dir / "tunnel" / "sockets"

    @property
    def effective_nats_url(self) -> str:
        return self.nats_url or f"nats://127.0.0.1:{self.nats_port}"

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'einsora.db'}"

    # api limits
    api_requests_per_minute: int = Field(
        default=1200,
        ge=0,
        description="Requests one user may make per minute in a tenant, all their API tokens "
        "and dashboard sessions together (429 with Retry-After past it); 0: no limit",
    )
    api_launches_per_minute: int = Field(
        default=300,
        ge=0,
        description="Launches (POST /v1/workloads) one user may make per minute in a tenant, all "
        "their API tokens and dashboard sessions together; 0: no limit",
    )
    # Issue 34, N6 (request heads are bounded) and N15 (routes that take no token are limited).
    api_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="Seconds a request's head (request line and headers) may take to arrive "
        "whole, from its first byte or the connection's opening: slower is answered 408 and "
        "closed (a connection that sent nothing is just closed)",
    )
    api_unauthenticated_requests_per_minute: int = Field(
        default=120,
        ge=0,
        description="Requests one client address (an IPv6 one by its /64) may make per minute "
        "to the routes that take no API token (sign-in, joins, invitations; not /readyz), 429 "
        "past it; the connection's address, or what a proxy of trusted_proxies forwarded; "
        "0: no limit",
    )
    tenant_max_workloads: int = Field(
        default=100,
        ge=0,
        description="A tenant's workloads that are not removed, unless the operator set its own "
        "cap (PUT /v1/tenants/{id}/limits); 0: no cap",
    )
    api_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve the api's Prometheus /metrics on this port of metrics_host (never "
        "on the API port); unset: not served; 0: any free port",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Where every service's /metrics listens: loopback unless set (0.0.0.0 in a "
        "container, where the scraper is another container)",
    )
    scheduler_metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="The scheduler's /metrics port; unset: none"
    )
    gateway_metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="The gateway's /metrics port; unset: none"
    )
    proxy_metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="The proxy's /metrics port; unset: none"
    )
    agent_metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="The agent's /metrics port; unset: none"
    )
    nats_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of every stream and bucket: 1 for one server (Solo), 3 for a "
        "3-node cluster (Lab, Datacenter); every service of a cell must use the same",
    )
    scheduler_tokens_key: Path | None = Field(
        default=None,
        description="The file of the key workloads' own tokens are derived from (0600); every "
        "scheduler of a region (leader and standby) must read the same one, or a takeover "
        "changes every running workload's token. Unset: <data_dir>/workload-tokens.key",
    )
    scheduler_lease_s: float = Field(
        default=3.0,
        gt=0,
        le=60,
        description="How long a scheduler's leader lease lasts without a heartbeat: a standby "
        "takes over this long after the leader's last one (ADR-0021)",
    )
    api_stream_heartbeat_s: float = Field(
        default=15.0,
        gt=0,
        le=300,
        description="Seconds of silence after which an event stream (SSE) sends a `: ping` "
        "comment, so proxies keep it open",
    )
    api_streams_per_token: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="Event streams one user may hold open in a tenant on one api replica, all "
        "their API tokens and dashboard sessions together (429 past it)",
    )
    # Issue 35, F6 (a late `scheduled` event lost the placement): how long workload events an
    # api took and never acked (it was killed) wait before the bus hands them out again.
    api_timeline_ack_wait_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds the bus waits for the api to ack a workload event it handed it "
        "before handing it out again: an api killed while applying events gets them back "
        "this long after, behind the events that followed them",
    )

    # the dashboard (ADR-0019)
    dashboard_dir: Path | None = Field(
        default=None,
        description="The built dashboard (Vite's output, with index.html); unset: the "
        "workspace's dashboard/dist when it has been built (`make dashboard`)",
    )
    session_idle_hours: float = Field(
        default=12.0,
        gt=0,
        le=24 * 90,
        description="A dashboard session ends after this many hours unused",
    )
    session_max_days: float = Field(
        default=7.0,
        gt=0,
        le=365,
        description="A dashboard session ends this many days after sign-in, used or not",
    )
    gateway_public_url: str | None = Field(
        default=None,
        description="The inference gateway's OpenAI base URL as clients reach it (the "
        "dashboard's code snippets name it); unset: http://<dashboard host>:<gateway_port>/v1",
    )

    # Issue 34, N5 and N12 (sign-in lockout, token count): whose X-Forwarded-For the api
    # believes, and how many live API tokens one user may hold.
    trusted_proxies: str = Field(
        default="",
        description="Comma-separated addresses or CIDRs of the proxies in front of the api "
        "whose X-Forwarded-For and X-Forwarded-Proto it believes (e.g. 10.0.0.0/8,127.0.0.1); "
        "unset: none, and the client is the address the connection came from",
    )
    api_tokens_per_user: int = Field(
        default=50,
        ge=1,
        le=100_000,
        description="Live API tokens (neither revoked nor expired) one user may hold, across "
        "tenants; the next is refused with a 409 until one is revoked",
    )

    activity_retention_days: int = Field(
        default=90,
        ge=1,
        le=36500,
        description="Days the activity log keeps an entry (GET /v1/activity); older ones are "
        "purged",
    )

    # accounting and fair share
    fair_share_half_life_h: float = Field(
        default=24.0,
        gt=0,
        description="Half-life of past usage in fair share: an hour of GPU use counts half as "
        "much this many hours later (Slurm's PriorityDecayHalfLife)",
    )
    accounting_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve accounting's Prometheus /metrics on this port of metrics_host; "
        "unset: not served; 0: any free port",
    )


def settings_from(flags: Mapping[str, Any]) -> Settings:
    """Settings from a command's flags (None: not given, so `EINSORA_*` or the default
    applies); a bad value is a ConfigError naming it, not a traceback."""
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(
            f"invalid setting: {what_is_wrong(exc)} (a flag, or EINSORA_<NAME> in the environment)"
        ) from exc
