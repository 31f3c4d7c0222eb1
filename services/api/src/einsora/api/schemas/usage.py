"""Usage reports: the query of `GET /v1/usage` and its answer (JSON, or CSV of the same rows)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from einsora.api.schemas.common import Query

DEFAULT_WINDOW_DAYS = 7
MAX_WINDOW_DAYS = 400

CSV_COLUMNS = ("group", "gpu_hours", "cpu_core_hours", "prompt_tokens", "completion_tokens")


class UsageGroupBy(StrEnum):
    """What a report sums by."""

    tenant = "tenant"
    user = "user"
    klass = "class"
    workload = "workload"
    endpoint = "endpoint"
    region = "region"
    day = "day"


class UsageQuery(Query):
    """`GET /v1/usage`: a window of time, and what to sum by."""

    start: datetime | None = Field(
        default=None,
        alias="from",
        description=f"ISO 8601 (no zone: UTC); default: {DEFAULT_WINDOW_DAYS} days before `to`",
    )
    end: datetime | None = Field(
        default=None, alias="to", description="ISO 8601, not included; default: now"
    )
    group_by: UsageGroupBy = Field(
        default=UsageGroupBy.tenant,
        description="`user` sums by the user who launched the workload or owns the gateway "
        "key; `endpoint` sums each endpoint's hours and the tokens it served, its replicas' "
        "with its own (a member: the hours of their endpoints, the tokens of their keys)",
    )
    tenant: str | None = Field(
        default=None,
        max_length=64,
        description="Only this tenant (the operator may name any; anyone else only their own)",
    )


class UsageItemOut(BaseModel):
    """One group's sums: hours of GPUs and CPU cores held (allocated, whatever their
    utilization), and tokens counted by the gateway."""

    group: str = Field(
        description="The tenant id, username, class, workload id, endpoint id, region or day "
        "(YYYY-MM-DD)"
    )
    gpu_hours: float
    cpu_core_hours: float
    prompt_tokens: int
    completion_tokens: int


class UsageReportOut(BaseModel):
    """The groups in [from, to), sorted by group; open allocations count up to now."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True)

    start: datetime = Field(alias="from")
    end: datetime = Field(alias="to")
    group_by: UsageGroupBy
    items: list[UsageItemOut]
    truncated: bool = Field(description="True when there were more groups than shown")
