"""Usage reports and quotas: accounting answers reports; quotas and usage live in KV `usage`.

Accounting owns the allocations and token counts. The api asks it for a report over
`accounting.report` (request/reply) and shapes the answer for its caller; the scheduler reads
each tenant's quota (`usage/quota.<tenant>`, written by the api) and recent usage
(`usage/tenant.<tenant>`, written by accounting) from the bucket.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from einsora.common.schemas.base import Message, utcnow


class ReportGroup(StrEnum):
    """What a usage report sums by (the api folds `user` from `workload` and `key`)."""

    tenant = "tenant"
    workload = "workload"
    key = "key"
    key_source = "key_source"
    """Tokens by gateway key and count source: each item's `group` is `<key_id>/<source>`
    (`key_source_group`), the source `upstream`, `tokenizer`, `estimate`, or `unknown` for
    hours counted before accounting kept the source."""
    endpoint = "endpoint"
    """Tokens by the replica that served them (its workload id); no allocations (the api
    takes an endpoint's hours from `workload` and folds replicas into their endpoint)."""
    klass = "class"
    region = "region"
    day = "day"


UNKNOWN_SOURCE = "unknown"
"""The count source of token hours summed before accounting kept it."""


def key_source_group(key_id: str, source: str) -> str:
    """A `key_source` item's group: `<key_id>/<source>`."""
    return f"{key_id}/{source}"


def split_key_source(group: str) -> tuple[str, str]:
    """A `key_source` item's (key_id, source); a source never holds `/`, so split at the last."""
    key_id, _, source = group.rpartition("/")
    return key_id, source


MAX_REPORT_ITEMS = 5_000
"""Groups in one reply: about 136 bytes each as JSON, so they fit one NATS message (1 MB)."""


class UsageReportRequest(Message):
    """`accounting.report`: sums of allocations and token counts in [from, to), grouped.

    `tenant_ids` None means every tenant (the operator's report). Open allocations count up to
    `now`. An allocation that spans several days is split at midnight UTC for `day`.
    """

    tenant_ids: list[str] | None = None
    workload_ids: list[str] | None = None
    key_ids: list[str] | None = None
    """With `workload_ids`: only these workloads' allocations and these keys' tokens (a
    member's own); None: no such filter."""
    endpoint_ids: list[str] | None = None
    """Only tokens served by these workloads (the replica that answered, as the gateway
    records it: an endpoint's own id and its replicas'); None: no such filter. Allocations
    are not narrowed by it."""
    group_by: ReportGroup
    start: datetime = Field(alias="from")
    end: datetime = Field(alias="to")
    now: datetime = Field(default_factory=utcnow)


class UsageItem(Message):
    """One group's sums: hours of GPUs and CPU cores held, tokens counted."""

    group: str
    gpu_hours: float = 0.0
    cpu_core_hours: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class UsageReportReply(Message):
    """Accounting's answer: the groups (at most MAX_REPORT_ITEMS), or why not."""

    items: list[UsageItem] = Field(default_factory=list)
    truncated: bool = False
    error: str | None = None


class TenantQuota(Message):
    """`usage/quota.<tenant>`: what the operator allows a tenant (each part optional)."""

    tenant_id: str
    max_gpus: dict[str, int] = Field(default_factory=dict)
    """Per GPU class: devices in use at once."""
    max_gpus_total: int | None = Field(default=None, ge=0)
    gpu_hours_per_7d: float | None = Field(default=None, ge=0)


class TenantUsage(Message):
    """`usage/tenant.<tenant>`: a tenant's recent use, published by accounting."""

    tenant_id: str
    gpu_hours_7d: float = 0.0
    """GPU-hours of the last 7 days (open allocations up to `at`)."""
    decayed_gpu_hours: float = 0.0
    """GPU-hours with each hour's weight halved every `half_life_h` (fair share's U)."""
    half_life_h: float = 24.0
    open_gpus: dict[str, int] = Field(default_factory=dict)
    """GPUs held now, by placed class."""
    at: datetime = Field(default_factory=utcnow)
