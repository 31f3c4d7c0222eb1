"""The base of every message on the bus: versioned, JSON, tolerant of newer senders.

A reader ignores fields it does not know, so a newer sender that adds a field does not crash an
older reader. `v` is the schema version of the message's shape; a reader that meets a higher
`v` still reads the fields it knows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Self

from pydantic import BaseModel, ConfigDict, ValidationError


def what_is_wrong(exc: ValidationError) -> str:
    """Which fields of a message are wrong and why, without their values (a message may carry
    a secret, and this text reaches logs)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}"
        for e in exc.errors(include_input=False, include_url=False)
    )


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (every timestamp on the bus is UTC)."""
    return datetime.now(UTC)


class Message(BaseModel):
    """A message on the bus or a value in KV."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    v: int = 1

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Self:
        return cls.model_validate_json(data)
