"""A tenant's quota (set by the operator) and its use now, as `/v1/tenants/{id}/quota` shows it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from einsora.api.schemas.common import RequestBody

MAX_DEVICES = 1_000_000
MAX_GPU_HOURS = 1e9

ClassName = Annotated[str, Field(min_length=1, max_length=64)]
Devices = Annotated[int, Field(ge=0, le=MAX_DEVICES)]


class QuotaUpdate(RequestBody):
    """`PUT /v1/tenants/{id}/quota` (the operator only): the whole quota, each part optional.

    A part that is null or left out is no limit of that kind; the PUT replaces the quota."""

    max_gpus: dict[ClassName, Devices] | None = Field(
        default=None,
        max_length=256,
        description="Per GPU class of the catalog: the most of its devices the tenant holds at "
        "once; null: no limit per class",
        examples=[{"l40s-48gb": 4}],
    )
    max_gpus_total: int | None = Field(
        default=None,
        ge=0,
        le=MAX_DEVICES,
        description="The most GPUs of any class the tenant holds at once; null: no limit",
    )
    gpu_hours_per_7d: float | None = Field(
        default=None,
        ge=0,
        le=MAX_GPU_HOURS,
        allow_inf_nan=False,
        description="The most GPU-hours the tenant uses in any 7 days; null: no limit",
    )


class QuotaOut(BaseModel):
    """The quota in force (an empty `max_gpus` and nulls: no limit)."""

    max_gpus: dict[str, int]
    max_gpus_total: int | None
    gpu_hours_per_7d: float | None
    updated_at: datetime | None = Field(description="When the operator last set it; null: never")


class QuotaUse(BaseModel):
    """What the tenant uses now, as accounting last published it (zeros before it has)."""

    gpus: dict[str, int] = Field(description="GPUs held now, by placed GPU class")
    gpus_total: int
    gpu_hours_7d: float = Field(description="GPU-hours of the last 7 days")
    at: datetime | None = Field(description="When accounting counted it; null: not yet")


class TenantQuotaOut(BaseModel):
    """A tenant's quota and its use now."""

    tenant_id: str
    quota: QuotaOut
    use: QuotaUse
