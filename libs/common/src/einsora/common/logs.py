"""JSON logging with `request_id`, `tenant` and `subject` bound for a request or a message.

Bind them once where a request or message enters (`with bind(request_id=…, tenant=…)`) and
every log line written while handling it carries them, through awaits and helper calls alike.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "einsora_log_context", default=None
)

# Attributes every LogRecord has; anything else was passed with `extra=` and is logged.
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


@contextmanager
def bind(**fields: str | None) -> Iterator[None]:
    """Add fields to every log line written inside the block (None values are skipped)."""
    current = dict(_CONTEXT.get() or {})
    current.update({k: v for k, v in fields.items() if v is not None})
    token = _CONTEXT.set(current)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def bound() -> dict[str, str]:
    """The fields bound now."""
    return dict(_CONTEXT.get() or {})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, bound context and extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_CONTEXT.get() or {})
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """A readable line for a terminal, with the bound context appended."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ctx = " ".join(f"{k}={v}" for k, v in (_CONTEXT.get() or {}).items())
        return f"{line} {ctx}" if ctx else line


def configure(level: str = "INFO", fmt: str = "json", stream: Any = None) -> None:
    """Route every logger through one handler in the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
