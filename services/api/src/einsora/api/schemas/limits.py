"""A tenant's limits: the operator's cap on its workloads, and the rate limits of its tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from einsora.api.schemas.common import RequestBody


class TenantLimitsUpdate(RequestBody):
    """`PUT /v1/tenants/{id}/limits` (the operator only)."""

    max_workloads: int | None = Field(
        ge=1,
        le=1_000_000,
        description="The most workloads the tenant may have that are not removed; null: no cap",
    )


class TenantLimitsOut(BaseModel):
    """The limits in force for a tenant, and how much of its cap it uses now."""

    tenant_id: str
    max_workloads: int | None = Field(
        description="The cap on workloads that are not removed; null: no cap"
    )
    source: Literal["tenant", "default"] = Field(
        description="`tenant`: set by the operator for this tenant; `default`: the settings'"
    )
    updated_at: datetime | None = Field(description="When the operator last set it")
    workloads: int = Field(description="The tenant's workloads that are not removed, now")
    requests_per_minute: int | None = Field(
        description="Requests per minute per user in a tenant, all their API tokens and "
        "dashboard sessions together; null: no limit"
    )
    launches_per_minute: int | None = Field(
        description="Launches per minute per user in a tenant, all their API tokens and "
        "dashboard sessions together; null: no limit"
    )
