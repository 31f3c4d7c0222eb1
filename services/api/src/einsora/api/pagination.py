"""Opaque cursors for every list: the base64 of the last item's sort key.

Ids sort by creation time (einsora.common.ids), so most lists page on the id alone; a cursor a
client tampered with is a 422 naming `cursor`, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from einsora.api.errors import field_error
from einsora.api.schemas.common import PageQuery

T = TypeVar("T")

_KEY_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def encode_cursor(key: Any) -> str:
    raw = json.dumps(key, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> Any:
    """The key a cursor carries; the caller checks its shape with `cursor_str` or its own test."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise field_error("cursor", "is not a cursor this API returned") from exc


def cursor_str(cursor: str | None) -> str | None:
    """A cursor whose key is one string (an id, a name), or None for the first page."""
    if cursor is None:
        return None
    key = decode_cursor(cursor)
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise field_error("cursor", "is not a cursor this API returned")
    return key


async def keyset_page(
    conn: AsyncConnection,
    stmt: sa.Select[Any],
    key: sa.ColumnElement[Any],
    query: PageQuery,
    item: Callable[[Any], T],
    key_of: Callable[[T], str],
) -> tuple[list[T], str | None]:
    """One page of `stmt` in `key` order after the query's cursor: the items and the next
    cursor (None on the last page). `key` must be unique (an id), so no item is seen twice."""
    after = cursor_str(query.cursor)
    if after is not None:
        stmt = stmt.where(key > after)
    rows = (await conn.execute(stmt.order_by(key).limit(query.limit + 1))).all()
    items = [item(r) for r in rows[: query.limit]]
    more = len(rows) > query.limit
    return items, encode_cursor(key_of(items[-1])) if more else None
