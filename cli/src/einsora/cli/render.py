"""Human output: aligned tables and short durations; `--json` bypasses all of it."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO = sys.stdout) -> None:
    cells = [[str(h).upper() for h in headers]] + [
        ["-" if v is None else str(v) for v in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    if not rows:
        out.write("(none)\n")


def as_json(value: Any, out: TextIO = sys.stdout) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def ago(timestamp: str | None) -> str:
    """`2026-11-29T12:00:00Z` → `3m ago`."""
    if not timestamp:
        return "-"
    try:
        at = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return timestamp
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    seconds = int((datetime.now(UTC) - at).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"
