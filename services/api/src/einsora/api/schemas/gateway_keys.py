"""Gateway key bodies: the key (`esk_…`) appears only in `GatewayKeyCreated`, once."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from einsora.api.schemas.common import Label, Page, RequestBody

MAX_MODELS = 64
MAX_PER_MINUTE = 1_000_000_000
"""A bound on `rpm` and `tpm` so every value fits the store's integer column on each engine."""
MAX_TOKENS_DEFAULT = 1_000_000


class GatewayKeyCreate(RequestBody):
    """`POST /v1/gateway/keys`: a key for the caller, in the caller's tenant."""

    name: Label
    models: list[Label] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MODELS,
        description="the endpoint names (workload names) the key may use; leave it out for "
        "every endpoint of the tenant",
    )
    rpm: int | None = Field(
        default=None, ge=1, le=MAX_PER_MINUTE, description="requests per minute; null: no limit"
    )
    tpm: int | None = Field(
        default=None, ge=1, le=MAX_PER_MINUTE, description="tokens per minute; null: no limit"
    )
    max_tokens_default: int = Field(
        default=1024,
        ge=1,
        le=MAX_TOKENS_DEFAULT,
        description="the `max_tokens` the gateway sets when a request names none",
    )
    expires_in_days: int | None = Field(default=None, ge=1, le=3650)


class GatewayKeyOut(BaseModel):
    """A gateway key without its secret."""

    id: str
    name: str
    user_id: str = Field(description="whose key it is (a tenant admin sees every member's)")
    models: list[str] | None
    rpm: int | None
    tpm: int | None
    max_tokens_default: int
    expires_at: datetime | None
    created_at: datetime
    last_used_at: datetime | None = Field(
        default=None,
        description="when the gateway last counted a request with it (learnt from its token "
        "counts within seconds); null: never",
    )


class GatewayKeyCreated(BaseModel):
    """A new gateway key with its secret (`key`), the only time the secret is shown."""

    id: str
    name: str
    key: str = Field(description="the secret, `esk_…`: shown now and never again")
    models: list[str] | None
    rpm: int | None
    tpm: int | None
    max_tokens_default: int
    expires_at: datetime | None
    created_at: datetime


class GatewayKeyPage(Page[GatewayKeyOut]):
    pass
