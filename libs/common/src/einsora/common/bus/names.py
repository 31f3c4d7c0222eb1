"""Every name on the bus: streams, subjects, KV buckets and keys, headers.

This module is the only place that spells them (DESIGN.md, "The bus contract"). Code elsewhere
calls these functions and constants, so a rename happens here once, and an operator reading
`nats stream view EVENTS` sees exactly what is documented.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# --- headers ----------------------------------------------------------------------------------

REQUEST_ID_HEADER: Final = "Einsora-Request-Id"
"""The request that caused a message; copied onto every message it causes."""

TRACEPARENT_HEADER: Final = "traceparent"
"""W3C trace context, so traces cross NATS."""

MSG_ID_HEADER: Final = "Nats-Msg-Id"
"""JetStream de-duplication id, set on every publish that may be retried."""

BATCH_ID_HEADER: Final = "Nats-Batch-Id"
BATCH_SEQUENCE_HEADER: Final = "Nats-Batch-Sequence"
BATCH_COMMIT_HEADER: Final = "Nats-Batch-Commit"
"""An atomic batch's headers (bus/batch.py): its id, each message's place in it, and on its last
message the commit. JetStream keeps them on the stored messages."""

# --- streams ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamName:
    """A JetStream stream and the subjects it captures."""

    name: str
    subjects: tuple[str, ...]
    description: str


INTENTS: Final = StreamName(
    "INTENTS",
    ("intent.*.workload.*",),
    "What users asked for (create, park, resume, remove), published by the api's outbox relay "
    "and consumed by the scheduler of the intent's region.",
)
EVENTS: Final = StreamName(
    "EVENTS",
    ("event.workload.*",),
    "Workload transitions and notes, published by the scheduler; read by api (timeline), "
    "accounting, gateway and proxy.",
)
USAGE: Final = StreamName(
    "USAGE",
    ("usage.tokens.*", "usage.allocation.*"),
    "Token counts from the gateway and allocations from accounting.",
)
STREAMS: Final = (INTENTS, EVENTS, USAGE)


def intent_subject(region: str, workload_id: str) -> str:
    """`intent.<region>.workload.<id>`."""
    return f"intent.{_token(region)}.workload.{_token(workload_id)}"


def intent_region_filter(region: str) -> str:
    """The subject filter of one region's intents, for that region's scheduler."""
    return f"intent.{_token(region)}.workload.*"


def event_subject(workload_id: str) -> str:
    """`event.workload.<id>`."""
    return f"event.workload.{_token(workload_id)}"


EVENTS_FILTER: Final = "event.workload.*"


def usage_tokens_subject(tenant_id: str) -> str:
    """`usage.tokens.<tenant>`."""
    return f"usage.tokens.{_token(tenant_id)}"


def usage_allocation_subject(tenant_id: str) -> str:
    """`usage.allocation.<tenant>`."""
    return f"usage.allocation.{_token(tenant_id)}"


# --- request/reply services ------------------------------------------------------------------

ACCESS_REDEEM_SUBJECT: Final = "access.redeem"
"""Request/reply: the proxy redeems an access ticket; the api answers (queue group `api`)."""

TOKENS_REVOKED_SUBJECT: Final = "api.tokens.revoked"
"""Core NATS, api to api: these API tokens were revoked; every replica drops them from its
cache of verified tokens at once (`TokensRevoked`)."""

ACCOUNTING_REPORT_SUBJECT: Final = "accounting.report"
"""Request/reply: the api asks accounting for a usage report (`UsageReportRequest`); queue
group `accounting`."""

ACCOUNTING_QUEUE_GROUP: Final = "accounting"

AUTH_REQUEST_SUBJECT: Final = "$SYS.REQ.USER.AUTH"
"""The server's auth callout requests (in the `AUTH` account); the api answers them (ADR-0016)."""


def server_kick_subject(server_id: str) -> str:
    """System account: close one client connection of server `server_id` (`{"cid": N}`)."""
    return f"$SYS.REQ.SERVER.{_token(server_id)}.KICK"


SERVER_KICK_SUBJECTS: Final = "$SYS.REQ.SERVER.*.KICK"

API_QUEUE_GROUP: Final = "api"
"""Queue group of the api's request/reply handlers, so several api replicas share them."""

# --- KV buckets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketName:
    """A KV bucket; `stream` is the JetStream stream that backs it."""

    name: str
    description: str
    max_value_size: int
    allow_rollup: bool
    max_age_s: float = 0.0
    """How long a value lives (0: until replaced or deleted)."""

    @property
    def stream(self) -> str:
        return f"KV_{self.name}"

    @property
    def subject_prefix(self) -> str:
        return f"$KV.{self.name}."

    def key_subject(self, key: str) -> str:
        return f"{self.subject_prefix}{key}"


MACHINES: Final = BucketName(
    "machines",
    "Each machine's complete desired state (scheduler), observed state and inventory (agent).",
    max_value_size=1024 * 1024,
    # One `Nats-Rollup: all` from an agent on its own key would purge every machine's keys.
    allow_rollup=False,
)
ROUTES: Final = BucketName(
    "routes",
    "Where each running workload answers, and its own token (scheduler → proxy, gateway).",
    max_value_size=64 * 1024,
    allow_rollup=False,
)
USAGE_KV: Final = BucketName(
    "usage",
    "Per-tenant recent usage (accounting) and quotas (api), read by the scheduler.",
    max_value_size=64 * 1024,
    allow_rollup=False,
)
GATEWAY_KEYS: Final = BucketName(
    "gateway_keys",
    "Each live gateway key's hash, tenant, models and limits; deleted when revoked "
    "(api → gateway).",
    max_value_size=16 * 1024,
    allow_rollup=False,
)
GATEWAY_LIMITS: Final = BucketName(
    "gateway_limits",
    "Requests and tokens each gateway key has used or reserved in the current minute, shared "
    "by every gateway replica (compare-and-set on each key's revision).",
    max_value_size=1024,
    allow_rollup=False,
    max_age_s=180.0,
)
ENROLMENTS: Final = BucketName(
    "enrolments",
    "Each enrolled machine's owner, region, sharing level, tunnel key and revocation, decided "
    "on the control plane at enrolment, never by the agent (api → scheduler, tunnel hub).",
    max_value_size=16 * 1024,
    allow_rollup=False,
)
REGIONS: Final = BucketName(
    "regions",
    "Each region's scheduler: a heartbeat every few seconds (liveness) and its free capacity "
    "per class (scheduler → api, the other regions' schedulers).",
    max_value_size=64 * 1024,
    allow_rollup=False,
)
MODEL_FALLBACKS: Final = BucketName(
    "model_fallbacks",
    "Each endpoint's fallback models (its `{\"model\": …}` steps), by the endpoint's workload "
    "id: where the gateway sends a request when no replica of the model answers "
    "(api → gateway).",
    max_value_size=16 * 1024,
    allow_rollup=False,
)
BUCKETS: Final = (
    MACHINES,
    ROUTES,
    USAGE_KV,
    GATEWAY_KEYS,
    GATEWAY_LIMITS,
    ENROLMENTS,
    REGIONS,
    MODEL_FALLBACKS,
)


def desired_key(machine_id: str) -> str:
    """`<machine>.desired` in `machines`."""
    return f"{_token(machine_id)}.desired"


def observed_key(machine_id: str) -> str:
    """`<machine>.observed` in `machines`."""
    return f"{_token(machine_id)}.observed"


def inventory_key(machine_id: str) -> str:
    """`<machine>.inventory` in `machines`."""
    return f"{_token(machine_id)}.inventory"


MACHINE_KEY_KINDS: Final = ("desired", "observed", "inventory")

DESIRED_SUBJECTS: Final = f"{MACHINES.subject_prefix}*.desired"
"""Every machine's desired key as a subject filter (for the scheduler's audit of the bucket)."""


def split_machine_key(key: str) -> tuple[str, str]:
    """`m-abc.observed` → (`m-abc`, `observed`); ValueError for anything else."""
    machine_id, _, kind = key.rpartition(".")
    if not machine_id or kind not in MACHINE_KEY_KINDS:
        raise ValueError(f"not a machines key: {key!r}")
    return machine_id, kind


def desired_watch_consumer(machine_id: str) -> str:
    """The pinned consumer name an agent uses to watch its own desired key.

    Permissions in Lab allow exactly
    `$JS.API.CONSUMER.CREATE.KV_machines.<m>_desired.$KV.machines.<m>.desired`.
    """
    return f"{_token(machine_id)}_desired"


LEADER_KEY_PREFIX: Final = "_leader"
"""Keys of the region schedulers' leader lease live in `machines` under this prefix (ADR-0021):
in the same stream as the desired states they fence, never a machine's (an agent reaches only
its own `<machine>.*` keys, and no machine key has three tokens)."""


def leader_term_key(region: str) -> str:
    """`_leader.<region>.term` in `machines`: who leads the region's scheduling, in which term
    (`LeaderLease`). Written only when the lease changes hands; every desired-state write of
    the leader carries its revision as the fence (`FENCE_HEADERS`), so NATS refuses the writes
    of a deposed leader."""
    return f"{LEADER_KEY_PREFIX}.{_token(region)}.term"


def leader_heartbeat_key(region: str) -> str:
    """`_leader.<region>.heartbeat` in `machines`: the leader renews its lease here every
    fraction of the lease (`LeaderLease`, fenced like a desired state); a standby takes over
    after a lease's length without one."""
    return f"{LEADER_KEY_PREFIX}.{_token(region)}.heartbeat"


LEADER_SUBJECTS: Final = f"{MACHINES.subject_prefix}{LEADER_KEY_PREFIX}.*.*"
"""Every region's lease keys as a subject filter (the scheduler's to write)."""

EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER: Final = "Nats-Expected-Last-Subject-Sequence"
"""JetStream stores the message only if the last message of a subject has this sequence."""

EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT_HEADER: Final = "Nats-Expected-Last-Subject-Sequence-Subject"
"""...of this subject rather than the message's own (nats-server 2.11+): the lease's term key,
so a desired-state write is stored only while the writer's term is the region's latest."""


def fence_headers(region: str, term_revision: int) -> dict[str, str]:
    """The headers that fence a leader's write on the revision of its region's term key."""
    return {
        EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER: str(term_revision),
        EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT_HEADER: MACHINES.key_subject(
            leader_term_key(region)
        ),
    }


def enrolment_key(machine_id: str) -> str:
    """`<machine>` in `enrolments`."""
    return _token(machine_id)


def route_key(workload_id: str) -> str:
    """`<workload>` in `routes`."""
    return _token(workload_id)


def gateway_key_key(key_id: str) -> str:
    """`<key id>` in `gateway_keys`."""
    return _token(key_id)


def gateway_limit_key(key_id: str, minute: int) -> str:
    """`<key id>.<minute>` in `gateway_limits`: one key's use in one minute (Unix minutes)."""
    return f"{_token(key_id)}.{minute}"


def tenant_usage_key(tenant_id: str) -> str:
    """`tenant.<id>` in `usage`: its recent use (accounting)."""
    return f"tenant.{_token(tenant_id)}"


def tenant_quota_key(tenant_id: str) -> str:
    """`quota.<id>` in `usage`: its quota (api)."""
    return f"quota.{_token(tenant_id)}"


def region_key(region: str) -> str:
    """`<region>` in `regions`: that region's scheduler (`RegionStatus`)."""
    return _token(region)


def model_fallback_key(workload_id: str) -> str:
    """`<endpoint workload id>` in `model_fallbacks`."""
    return _token(workload_id)


def agent_inbox_prefix(machine_id: str) -> str:
    """Each agent's own inbox prefix, so it cannot read other agents' replies."""
    return f"_INBOX_{_token(machine_id)}"


_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def is_subject_token(value: str, max_length: int = 128) -> bool:
    """Whether `value` can be one token of a subject (and so a key, a consumer name, a file
    name): letters, digits, `-` and `_`, 1 to `max_length` of them. The one test of a machine's
    or a workload's id wherever it names something on the bus or on disk."""
    return 0 < len(value) <= max_length and bool(_TOKEN_RE.match(value))


def _token(value: str) -> str:
    """Refuse anything that would change a subject's shape (dots, wildcards, spaces)."""
    if not _TOKEN_RE.match(value):
        raise ValueError(f"not a valid subject token: {value!r}")
    return value
