"""Logging for people and for machines, with `request_id`, `tenant` and `subject` bound for a
request or a message.

Bind them once where a request or message enters (`with bind(request_id=…, tenant=…)`) and
every log line written while handling it carries them, through awaits and helper calls alike.

Two formats: short human lines (`HH:MM:SS LEVEL logger message key=value…`) for a terminal,
JSON lines for a file, a journal or a collector. `auto`, the default, picks by whether the
stream is a terminal. Every line is passed through `redaction` first (its message, each field,
a traceback): a token or a password logged by mistake comes out as `REDACTED`. This module
imports only the standard library: every command's parser uses `add_arguments`, and
`einsora --help` must stay fast.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from einsora.common.errors import ConfigError
from einsora.common.redaction import REDACTED, redact, redact_text, secret_named_by

if TYPE_CHECKING:
    from einsora.common.settings import Settings

FORMATS = ("auto", "human", "json")
"""What `--log-format` takes; `text`, the older name of `human`, is still accepted."""
LEVELS = ("debug", "info", "warning", "error")

_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "einsora_log_context", default=None
)

# Attributes every LogRecord has; anything else was passed with `extra=` and is logged.
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

# Control characters in a message or value (a workload's name, a path) must not move the
# cursor, forge a second line or reverse the text on a person's terminal: C0, DEL, C1, the
# line separators and the bidi controls are written as escapes.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    c: f"\\u{c:04x}" for c in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
}


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


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The bound context, then the record's `extra=` fields, each with its secrets redacted."""
    fields: dict[str, Any] = dict(_CONTEXT.get() or {})
    for key, value in record.__dict__.items():
        if key not in _RECORD_ATTRS and not key.startswith("_"):
            fields[key] = value
    return {key: _guarded(key, value) for key, value in fields.items()}


def _guarded(key: str, value: Any) -> Any:
    """A field as it may be written: whole `REDACTED` under a key that names a secret, else
    with any secret in it replaced. Numbers, booleans and None pass as they are (cheap)."""
    if value is None or isinstance(value, bool | int | float):
        if value is not None and not isinstance(value, bool) and secret_named_by(key):
            return REDACTED
        return value
    if secret_named_by(key) is not None and value != "":
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict | list | tuple):
        return redact(value)[0]
    return redact_text(str(value))  # what the formatters would write: its text


def message_of(record: logging.LogRecord) -> str:
    """The record's message with its secrets redacted."""
    return redact_text(record.getMessage())


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, bound context and extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message_of(record),
        }
        entry.update(fields_of(record))
        if record.exc_info:
            entry["exc"] = redact_text(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class HumanFormatter(logging.Formatter):
    """`HH:MM:SS LEVEL logger message key=value…`: local time, as a person reads a clock."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        line = f"{at} {record.levelname:<5} {record.name} {_safe(message_of(record))}"
        pairs = render_fields(fields_of(record))
        if pairs:
            line = f"{line} {pairs}"
        if record.exc_info:
            line = f"{line}\n{redact_text(self.formatException(record.exc_info))}"
        return line


class TextFormatter(logging.Formatter):
    """A line in the caller's own `%`-format, with the bound context and extras appended."""

    def format(self, record: logging.LogRecord) -> str:
        line = redact_text(super().format(record))
        pairs = render_fields(fields_of(record))
        return f"{line} {pairs}" if pairs else line


def render_fields(fields: Mapping[str, Any]) -> str:
    """`key=value` pairs; a value with spaces, quotes or `=` (or an empty one) is quoted."""
    return " ".join(f"{_safe(str(k))}={_value(v)}" for k, v in fields.items())


def _value(value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text, ensure_ascii=False)  # quoted, with its control characters escaped
    return _safe(text)


def _safe(text: str) -> str:
    return text.translate(_CONTROL)


def resolve_format(fmt: str, stream: TextIO) -> str:
    """`human` or `json`: what `fmt` means for this stream (`auto`: human on a terminal)."""
    name = fmt.lower()
    if name == "text":
        return "human"
    if name == "auto":
        isatty = getattr(stream, "isatty", None)
        return "human" if isatty is not None and isatty() else "json"
    if name in FORMATS:
        return name
    raise ConfigError(f"unknown log format {fmt!r}: use one of {', '.join(FORMATS)}")


def level_of(level: str | int) -> int:
    """The numeric level of a name such as `info` (any case); a bad name is a ConfigError."""
    if isinstance(level, int):
        return level
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        raise ConfigError(f"unknown log level {level!r}: use one of {', '.join(LEVELS)}")
    return number


def configure(level: str | int = "INFO", fmt: str = "auto", stream: TextIO | None = None) -> str:
    """Route every logger through one handler in the chosen format; returns the format used
    (`human` or `json`)."""
    out = stream or sys.stderr
    chosen = resolve_format(fmt, out)
    number = level_of(level)
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if chosen == "json" else HumanFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
    return chosen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--log-level` and `--log-format`, the same on every service command and Solo."""
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LEVELS,
        help="the least severe lines logged (EINSORA_LOG_LEVEL; default info)",
    )
    parser.add_argument(
        "--log-format",
        type=str.lower,
        # `text` too: the older name of `human`, still in scripts and tests.
        choices=(*FORMATS, "text"),
        metavar="{" + ",".join(FORMATS) + "}",
        help="human lines or JSON lines; auto: human on a terminal, JSON otherwise "
        "(EINSORA_LOG_FORMAT; default auto)",
    )


def configure_from(
    settings: Settings,
    level: str | None = None,
    fmt: str | None = None,
    stream: TextIO | None = None,
) -> str:
    """`configure` with a command's flags over the settings: a flag wins, then
    `EINSORA_LOG_LEVEL` / `EINSORA_LOG_FORMAT`, then info and auto."""
    return configure(level or settings.log_level, fmt or settings.log_format, stream)
