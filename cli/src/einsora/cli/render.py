"""Human output: aligned tables and short durations; `--json` bypasses all of it.

Every string the CLI prints for a person goes through `escape`, whoever wrote it: a name, a
label or a reason comes from the server, and a control character in one (an ANSI sequence, a
carriage return, a bidi override such as U+202E, a line separator U+2028) would move the cursor,
reorder a line or forge a row of the table. `--json` needs nothing more: `json.dumps` writes
every non-ASCII character as a `\\u` escape already.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

# Controls (C0, DEL, C1), format characters (bidi overrides and isolates, zero-width ones),
# lone surrogates, and the line and paragraph separators.
_SHOWN_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def escape(value: object) -> str:
    """`value` as text, with every character that is not plain visible text shown as an escape
    (`\\x1b`, `\\u202e`, `\\U000e0041`); every other character, accented or not, is kept."""
    text = str(value)
    if text.isprintable():  # nothing of the above (and the usual case)
        return text
    return "".join(_escaped(c) if unicodedata.category(c) in _SHOWN_ESCAPED else c for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO = sys.stdout) -> None:
    cells = [[escape(h).upper() for h in headers]] + [
        ["-" if v is None else escape(v) for v in row] for row in rows
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
