"""Column types every service's tables share.

One UTC datetime type: an aware UTC datetime in, an aware UTC datetime out, on both engines. A
naive datetime is refused when it is bound, never guessed at (as local time, say): every time
Einsora keeps comes from the control plane's clock, in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime. `timezone`: the column's SQL type carries a time zone
    (`timestamptz` on Postgres); without it the value is stored as naive UTC."""

    impl = sa.DateTime
    cache_ok = True

    def __init__(self, timezone: bool = False) -> None:
        super().__init__(timezone=timezone)
        self._with_zone = timezone

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; use an aware UTC time")
        utc = value.astimezone(UTC)
        return utc if self._with_zone and dialect.name != "sqlite" else utc.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
