"""Who may do what on the bus: one identity per service (and per machine), each with only the
subjects it needs (ADR-0009).

Every NATS client authenticates, in Solo too. An identity is an nkey: the server's config holds
only its public key, and the client proves it holds the seed, kept 0600 in
`<credentials dir>/<identity>.nk`. The permission templates here are the only place that says
which subjects each service may use:
- only the api answers `access.redeem`;
- only the scheduler writes machines' `desired` keys and its region's leader lease, and publishes
  workload events;
- only the proxy (and later the gateway) read the `routes` bucket, which holds workloads' tokens;
- an agent reaches its own machine's keys and nothing else (the template FIELD-NOTES checked),
  from an account of the machines' own (`accounts.MACHINE_ACCOUNT`, ADR-0028): it creates no
  consumer (a consumer's deliver subject, and any request's reply subject, would otherwise let
  it make the server publish anywhere in the app account), and the account bounds its payloads
  and subscriptions.
Each identity has its own inbox prefix, so no one reads another's replies.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nkeys

from einsora.common.bus import names
from einsora.common.errors import ConfigError

API = "api"
SCHEDULER = "scheduler"
PROXY = "proxy"
GATEWAY = "gateway"
ACCOUNTING = "accounting"
SERVICES = (API, SCHEDULER, PROXY, GATEWAY, ACCOUNTING)

SEED_SUFFIX = ".nk"


@dataclass(frozen=True)
class Permissions:
    """A NATS user's permissions: allow-lists (denials win over them), and replies."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    allow_responses: bool = False
    machine: bool = False
    """A machine's (an agent's): its session lives in the machines' account, which reaches the
    app account only through the imports of its machines' keys, within the account's limits."""

    def to_conf(self) -> str:
        """The `permissions { … }` block of a nats-server config."""
        publish = f"allow: {_list(self.publish)}"
        if self.publish_deny:
            publish += f", deny: {_list(self.publish_deny)}"
        text = f"publish: {{{publish}}}, subscribe: {{allow: {_list(self.subscribe)}}}"
        if self.allow_responses:
            text += ", allow_responses: true"
        return f"{{{text}}}"


def _list(items: Iterable[str]) -> str:
    for item in items:
        if '"' in item or "\\" in item:
            raise ValueError(f"not a subject: {item!r}")
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def inbox_prefix(identity: str) -> str:
    """Each identity's own inbox prefix (`_INBOX_<identity>`)."""
    return names.agent_inbox_prefix(identity)


def _provisions(*streams: str) -> list[str]:
    return [
        f"$JS.API.STREAM.{verb}.{stream}"
        for stream in streams
        for verb in ("INFO", "CREATE", "UPDATE")
    ]


def _consumes(stream: str) -> list[str]:
    """Durable or ephemeral consumers of any filter on `stream`, their messages and acks."""
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _reads_bucket(bucket: names.BucketName) -> list[str]:
    """Every key of a bucket: gets and watches."""
    return [
        f"$JS.API.DIRECT.GET.{bucket.stream}",
        f"$JS.API.DIRECT.GET.{bucket.stream}.>",
        f"$JS.API.STREAM.MSG.GET.{bucket.stream}",
        *_consumes(bucket.stream),
    ]


# What no service may do to the bus's history, whatever else it is allowed.
_NEVER = (
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
)


def service_permissions(identity: str) -> Permissions:
    """The permission template of a control-plane service."""
    inbox = f"{inbox_prefix(identity)}.>"
    everything_but_routes = [
        *(s.name for s in names.STREAMS),
        *(b.stream for b in names.BUCKETS if b is not names.ROUTES),
    ]
    if identity == API:
        return Permissions(
            publish=(
                "$JS.API.INFO",
                *_provisions(*everything_but_routes),
                "intent.>",
                # Anti-entropy: the last intent on one workload's subject (ADR-0011); only the
                # last-by-subject form, only on intent subjects.
                f"$JS.API.DIRECT.GET.{names.INTENTS.name}.{names.INTENTS.subjects[0]}",
                *_consumes(names.EVENTS.name),
                # The gateway's token counts, for each key's last use (issue 18).
                *_consumes(names.USAGE.name),
                # It watches inventories and observed states for /v1/machines. nats-py's
                # watch creates consumers through the unfiltered API, so this cannot be
                # narrowed to those keys (ADR-0009 names the residual).
                *_reads_bucket(names.MACHINES),
                names.TOKENS_REVOKED_SUBJECT,
                # It publishes gateway keys (hashes only) and deletes revoked ones, and lists
                # the bucket at start-up to put right what a crash left (anti-entropy).
                f"{names.GATEWAY_KEYS.subject_prefix}>",
                *_reads_bucket(names.GATEWAY_KEYS),
                # Usage reports come from accounting; quotas go to the scheduler through KV.
                names.ACCOUNTING_REPORT_SUBJECT,
                f"{names.USAGE_KV.subject_prefix}quota.*",
                *_reads_bucket(names.USAGE_KV),
                # It enrols and revokes machines (from its store), and lists the bucket at
                # start-up to put right what a crash left.
                f"{names.ENROLMENTS.subject_prefix}*",
                *_reads_bucket(names.ENROLMENTS),
                # /v1/regions: each region's scheduler, alive or not, and its free capacity.
                *_reads_bucket(names.REGIONS),
                # Endpoints' model fallbacks for the gateway (ADR-0022), repaired by a pass.
                f"{names.MODEL_FALLBACKS.subject_prefix}*",
                *_reads_bucket(names.MODEL_FALLBACKS),
            ),
            publish_deny=(*_NEVER, names.DESIRED_SUBJECTS),
            subscribe=(inbox, names.ACCESS_REDEEM_SUBJECT, names.TOKENS_REVOKED_SUBJECT),
            allow_responses=True,
        )
    if identity == SCHEDULER:
        return Permissions(
            publish=(
                "$JS.API.INFO",
                *_provisions(*everything_but_routes, names.ROUTES.stream),
                names.EVENTS_FILTER,
                *_consumes(names.INTENTS.name),
                *_reads_bucket(names.MACHINES),
                names.DESIRED_SUBJECTS,
                # Its region's leader lease: the term (taken by compare-and-set) and the
                # heartbeat, both in `machines` beside the desired states they fence (ADR-0021).
                names.LEADER_SUBJECTS,
                # It writes and lists routes (it made their tokens); reading a value is the
                # proxy's and gateway's alone.
                f"{names.ROUTES.subject_prefix}>",
                *_consumes(names.ROUTES.stream),
                *_reads_bucket(names.USAGE_KV),
                *_reads_bucket(names.ENROLMENTS),
                # A region step hands a workload over to the next region's scheduler, and an
                # intent that arrives after it is passed on there (ADR-0022).
                names.INTENTS.subjects[0],
                # Its own region's heartbeat, and the other regions' (a region step goes only
                # to a region whose scheduler is up).
                f"{names.REGIONS.subject_prefix}*",
                *_reads_bucket(names.REGIONS),
            ),
            publish_deny=(
                *_NEVER,
                f"$JS.API.DIRECT.GET.{names.ROUTES.stream}",
                f"$JS.API.DIRECT.GET.{names.ROUTES.stream}.>",
                f"$JS.API.STREAM.MSG.GET.{names.ROUTES.stream}",
            ),
            subscribe=(inbox,),
        )
    if identity == PROXY:
        return Permissions(
            publish=(
                "$JS.API.INFO",
                *_provisions(names.ROUTES.stream),
                names.ACCESS_REDEEM_SUBJECT,
                *_reads_bucket(names.ROUTES),
                # Its tunnel hub knows each machine by the key in its enrolment.
                *_reads_bucket(names.ENROLMENTS),
            ),
            publish_deny=_NEVER,
            subscribe=(inbox,),
        )
    if identity == GATEWAY:
        return Permissions(
            publish=(
                "$JS.API.INFO",
                *_provisions(names.GATEWAY_LIMITS.stream),
                *_reads_bucket(names.ROUTES),
                *_reads_bucket(names.GATEWAY_KEYS),
                # Limits shared by every gateway replica: reads, and compare-and-set puts.
                *_reads_bucket(names.GATEWAY_LIMITS),
                f"{names.GATEWAY_LIMITS.subject_prefix}>",
                # An endpoint's model fallbacks: where a request goes when no replica answers.
                *_reads_bucket(names.MODEL_FALLBACKS),
                "usage.tokens.*",
                *_consumes(names.EVENTS.name),
            ),
            publish_deny=_NEVER,
            subscribe=(inbox,),
        )
    if identity == ACCOUNTING:
        return Permissions(
            publish=(
                "$JS.API.INFO",
                *_consumes(names.EVENTS.name),
                *_consumes(names.USAGE.name),
                "usage.allocation.*",
                f"{names.USAGE_KV.subject_prefix}tenant.*",
                *_reads_bucket(names.USAGE_KV),
                *_provisions(names.USAGE_KV.stream),
            ),
            publish_deny=_NEVER,
            subscribe=(inbox, names.ACCOUNTING_REPORT_SUBJECT),
            allow_responses=True,
        )
    raise ValueError(f"no such service identity: {identity!r}")


def agent_permissions(identity: str, machine_ids: Sequence[str] | None = None) -> Permissions:
    """An agent's: its machines' own keys and its own inbox; nothing else.

    `identity` is the agent's (its machine id); a sim agent hosting several machines names them
    in `machine_ids`. It watches its desired key with a plain subscription to the key's subject
    and reads it with a direct get after every (re)connect: no consumer, so nothing it could point
    at another subject (ADR-0028). Its session is a machine's (`Permissions.machine`).
    """
    machines = names.MACHINES
    publish: list[str] = []
    subscribe: list[str] = [f"{names.agent_inbox_prefix(identity)}.>"]
    for m in machine_ids or [identity]:
        desired = machines.key_subject(names.desired_key(m))
        publish += [
            f"$JS.API.DIRECT.GET.{machines.stream}.{desired}",
            machines.key_subject(names.observed_key(m)),
            machines.key_subject(names.inventory_key(m)),
        ]
        subscribe.append(desired)
    return Permissions(publish=tuple(publish), subscribe=tuple(subscribe), machine=True)


def sim_machine_ids(agent: str, count: int) -> list[str]:
    """The machines a sim agent hosts, as `einsora agent --machine-id AGENT --sim-machines N`
    names them: `[agent]` for one, `agent-0001` … for several. `einsora bus-config
    --sim-agent` grants them and the api enrols them (`POST /v1/machines/sim-agents`), so all
    three must name the same machines."""
    if count < 1:
        raise ValueError(f"a sim agent hosts at least 1 machine, not {count}")
    if count == 1:
        return [agent]
    width = max(4, len(str(count)))
    return [f"{agent}-{i:0{width}d}" for i in range(1, count + 1)]


# --- seeds on disk ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """One bus identity: its name, seed (secret) and public key."""

    name: str
    seed: str = field(repr=False)

    @property
    def public_key(self) -> str:
        key: bytes = nkeys.from_seed(self.seed.encode()).public_key
        return key.decode()


def seed_path(directory: Path, identity: str) -> Path:
    """`<directory>/<identity>.nk`; the identity is a subject token (a service or machine id)."""
    inbox_prefix(identity)  # refuses anything that is not a subject token
    return directory / f"{identity}{SEED_SUFFIX}"


def _new_seed() -> str:
    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode()


def ensure_identity(directory: Path, identity: str) -> Identity:
    """The identity's seed from `directory`, made (mode 0600) on first use."""
    path = seed_path(directory, identity)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        if not path.exists():
            partial = path.with_name(f".{path.name}.partial")
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(_new_seed() + "\n")
            os.replace(partial, path)
        return load_identity(directory, identity)
    except OSError as exc:
        raise ConfigError(f"cannot make the bus credential {path}: {exc}") from exc


def load_identity(directory: Path, identity: str) -> Identity:
    """The identity's seed from `directory`; a clear error when it is missing or unreadable."""
    path = seed_path(directory, identity)
    try:
        seed = path.read_text().strip()
        nkeys.from_seed(seed.encode())
    except (OSError, nkeys.NkeysError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the bus credential of {identity!r} at {path}: {exc}; "
            "check EINSORA_NATS_CREDENTIALS_DIR"
        ) from exc
    return Identity(identity, seed)


def authorization_conf(users: Mapping[str, tuple[Identity, Permissions]]) -> str:
    """The `authorization { users = [...] }` block: one nkey user per identity."""
    lines = [
        f"    {{nkey: {identity.public_key}, permissions: {permissions.to_conf()}}}"
        for identity, permissions in users.values()
    ]
    return "authorization {\n  users = [\n" + ",\n".join(lines) + "\n  ]\n}\n"


# --- the accounts layout (auth callout) -------------------------------------------------------

CALLOUT = "callout"
"""The auth callout responder's identity: it answers the server's authorization requests, and
may do nothing else."""
SYSTEM = "system"
"""The control plane's identity in the system account: it kicks revoked machines' connections."""
ISSUER = "callout-issuer"
"""The account nkey that signs the user JWTs the callout issues; the server trusts its public key.
Its seed (`SA…`) is an account seed, not a user seed."""
AUTH_REQUEST_SUBJECT = names.AUTH_REQUEST_SUBJECT
"""Where the server asks the auth callout who a connecting client is (in the callout's account)."""
CONTROL_PLANE = frozenset({*SERVICES, CALLOUT, SYSTEM, ISSUER})
"""The control plane's own identities: a machine or sim agent named so would share its seed file
in the credentials dir, and its identity on the bus."""


def callout_permissions() -> Permissions:
    """The callout's: receive the server's authorization requests and answer them; nothing else."""
    return Permissions(
        publish=(), publish_deny=(">",), subscribe=(AUTH_REQUEST_SUBJECT,), allow_responses=True
    )


def system_permissions() -> Permissions:
    """The system identity's: kick a connection on any server, and read its own replies."""
    return Permissions(
        publish=(names.SERVER_KICK_SUBJECTS,), subscribe=(f"{inbox_prefix(SYSTEM)}.>",)
    )


def ensure_issuer(directory: Path) -> Identity:
    """The callout issuer's account seed from `directory`, made (mode 0600) on first use."""
    path = seed_path(directory, ISSUER)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        if not path.exists():
            seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)
            partial = path.with_name(f".{path.name}.partial")
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(seed.decode() + "\n")
            os.replace(partial, path)
    except OSError as exc:
        raise ConfigError(f"cannot make the bus credential {path}: {exc}") from exc
    issuer = load_identity(directory, ISSUER)
    if not issuer.public_key.startswith("A"):
        raise ConfigError(f"{path} holds no account seed (SA…): the callout issuer needs one")
    return issuer


__all__ = [
    "AUTH_REQUEST_SUBJECT",
    "CALLOUT",
    "CONTROL_PLANE",
    "ISSUER",
    "SERVICES",
    "SYSTEM",
    "Identity",
    "Permissions",
    "agent_permissions",
    "authorization_conf",
    "callout_permissions",
    "ensure_identity",
    "ensure_issuer",
    "inbox_prefix",
    "load_identity",
    "seed_path",
    "service_permissions",
    "sim_machine_ids",
    "system_permissions",
]
