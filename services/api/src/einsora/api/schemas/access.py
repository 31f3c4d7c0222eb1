"""The access link a person opens to reach a running workload's web UI."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class AccessOut(BaseModel):
    """A one-time link to the workload's own site, valid until `expires_at` (60 s)."""

    url: str = Field(examples=["http://w-01m8….localhost:8081/_einsora/enter?ticket=…"])
    expires_at: datetime
