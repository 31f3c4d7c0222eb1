"""Health bodies: `/healthz` (the process answers) and `/readyz` (store and bus reachable)."""

from __future__ import annotations

from pydantic import BaseModel


class HealthOut(BaseModel):
    status: str


class ReadyOut(BaseModel):
    """`status` is `ready` when every check is `ok`; the answer is then 200, else 503."""

    status: str
    checks: dict[str, str]
