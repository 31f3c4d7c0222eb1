"""Opaque cursors for every list: the base64 of the last item's sort key.

Ids sort by creation time (einsora.common.ids), so most lists page on the id alone; a cursor a
client tampered with is a 422 naming `cursor`, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from einsora.api.errors import field_error

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
