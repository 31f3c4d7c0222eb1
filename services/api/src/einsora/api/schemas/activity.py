"""The activity log as the API shows it: one entry per API action, and the query that filters
it (`GET /v1/activity`, `GET /v1/activity/export`)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from einsora.api.schemas.common import Page, PageQuery, Query

EXPORT_COLUMNS = (
    "seq",
    "at",
    "tenant_id",
    "user_id",
    "username",
    "token_id",
    "action",
    "route",
    "target",
    "outcome",
    "status",
    "request_id",
)
"""The fields of an entry, in the order of the CSV export's columns."""


class ActivityFilter(Query):
    """Which entries: a window of time, one user, one action, one tenant (the operator)."""

    start: datetime | None = Field(
        default=None, alias="from", description="ISO 8601 (no zone: UTC), included"
    )
    end: datetime | None = Field(
        default=None, alias="to", description="ISO 8601 (no zone: UTC), not included"
    )
    user: str | None = Field(
        default=None, max_length=64, description="Only this user's actions (their id or name)"
    )
    action: str | None = Field(
        default=None,
        max_length=64,
        description="Only this action (`workload.create`), or every action of a noun "
        "(`workload.*`)",
    )
    tenant: str | None = Field(
        default=None,
        max_length=64,
        description="Only this tenant's log (the operator may name any; an admin their own)",
    )


class ActivityQuery(ActivityFilter, PageQuery):
    """`GET /v1/activity`: the filter, and a page of it."""


class ExportFormat(StrEnum):
    jsonl = "jsonl"
    csv = "csv"


class ActivityExportQuery(ActivityFilter):
    """`GET /v1/activity/export`: the filter, and the format of the whole of it."""

    format: ExportFormat = Field(
        default=ExportFormat.jsonl, description="`jsonl`: one JSON entry a line; `csv`"
    )


class ActivityOut(BaseModel):
    """One API action: who did it, with which credential, to what, and how it ended."""

    seq: int = Field(description="Its place in the log (later entries have higher ones)")
    at: datetime
    tenant_id: str
    user_id: str | None = None
    username: str | None = None
    token_id: str | None = Field(
        default=None,
        description="The id of the credential used (API token, join token, access ticket); "
        "never its secret",
    )
    action: str = Field(examples=["workload.create"])
    route: str = Field(
        description="The method and route template, or the bus subject a service asked on",
        examples=["POST /v1/workloads"],
    )
    target: str | None = Field(default=None, description="The id of what it acted on")
    outcome: str = Field(description="`ok` or `failed`", examples=["ok"])
    status: int = Field(description="The HTTP status it was answered with")
    request_id: str


class ActivityPage(Page[ActivityOut]):
    """The log, newest first."""
