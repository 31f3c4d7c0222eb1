"""API token bodies: the secret appears only in `TokenCreated`, once."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from einsora.api.schemas.common import Label, Page, RequestBody


class TokenCreate(RequestBody):
    name: Label
    expires_in_days: int | None = Field(default=None, ge=1, le=3650)
    operator: bool = Field(
        default=False,
        description="carry operator rights: only an operator token may ask, for its own user",
    )


class TokenOut(BaseModel):
    """A token without its secret."""

    id: str
    name: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    operator: bool


class TokenCreated(BaseModel):
    """A new token with its secret (`token`), the only time the secret is shown."""

    id: str
    name: str
    token: str = Field(description="the secret, `tsk_…`: shown now and never again")
    created_at: datetime
    expires_at: datetime | None
    operator: bool = False


class TokenPage(Page[TokenOut]):
    pass
