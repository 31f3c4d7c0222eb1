"""What every request and response shares: the error body, list pages, and name patterns.

Request bodies forbid unknown fields, so a typo (`clas`) is a 422 naming it rather than a
silently ignored field, and their types are strict, so `"count": "1"` or `true` is a 422 rather
than a guess. These models are also the source of the OpenAPI document.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

SLUG_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
"""Usernames and tenant names: lowercase, digits, `.`, `_`, `-`; 1 to 63 characters."""

_CONTROLS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
LABEL_PATTERN = f"^[^{_CONTROLS}]{{1,64}}$"
"""A free-text label (a token's or workload's name): 1 to 64 characters, none of them a control
character: C0 and C1 controls, the bidirectional controls and marks (U+202E reverses the text
after it), or the line and paragraph separators U+2028 and U+2029. Names are printed on
terminals and pages, where these would move, hide or disguise what is shown."""

_CONTROL_RE = re.compile(f"[{_CONTROLS}]")


def _no_controls(value: str) -> str:
    found = _CONTROL_RE.search(value)
    if found is not None:
        raise ValueError(f"must not contain control characters (found U+{ord(found[0]):04X})")
    return value


Slug = Annotated[str, Field(pattern=SLUG_PATTERN, examples=["alice"])]
Label = Annotated[
    str,
    Field(min_length=1, max_length=64, json_schema_extra={"pattern": LABEL_PATTERN}),
    AfterValidator(_no_controls),
]

T = TypeVar("T")


class RequestBody(BaseModel):
    """Base of request bodies: unknown fields are an error, types are strict (no `"1"` for 1,
    no `true` for 1), strings are not stripped."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Query(BaseModel):
    """Base of query strings; unknown parameters are ignored."""

    model_config = ConfigDict(extra="ignore")


class PageQuery(Query):
    """Cursor pagination: `limit` items after the opaque `cursor` of the previous page."""

    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = Field(default=None, max_length=512)


class Page(BaseModel, Generic[T]):
    """One page of a list; `next_cursor` is null on the last page."""

    items: list[T]
    next_cursor: str | None = None


class ErrorDetail(BaseModel):
    """One thing wrong with a request, e.g. the field `class`."""

    field: str
    message: str
    type: str


class ErrorBody(BaseModel):
    """Every error answer's body."""

    error: str = Field(description="machine-readable code, e.g. `validation_error`")
    message: str = Field(description="what went wrong, for a person")
    request_id: str
    details: list[ErrorDetail] = Field(default_factory=list)


def as_details(errors: list[Any]) -> list[dict[str, Any]]:
    """Pydantic's errors as `details` entries (`field`: the dotted location)."""
    details = []
    for error in errors:
        location = ".".join(str(part) for part in error.get("loc", ())) or "body"
        details.append({"field": location, "message": error.get("msg", ""), "type": error["type"]})
    return details
