"""Time arithmetic of accounting: UTC days and hours, and how a report's range splits.

A report over [start, end) reads whole days (or hours) from sums kept per day (or hour), and
only the partial periods at its two edges from the rows themselves; `split` says which is
which. Every time here is an aware UTC datetime: accounting keeps only the control plane's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


def floor_day(t: datetime) -> datetime:
    """Midnight UTC at or before `t`."""
    u = t.astimezone(UTC)
    return datetime(u.year, u.month, u.day, tzinfo=UTC)


def floor_hour(t: datetime) -> datetime:
    """The top of the UTC hour at or before `t`."""
    u = t.astimezone(UTC)
    return datetime(u.year, u.month, u.day, u.hour, tzinfo=UTC)


def _ceil(t: datetime, unit: timedelta) -> datetime:
    floor = floor_day(t) if unit == DAY else floor_hour(t)
    return floor if floor == t else floor + unit


def _floor(t: datetime, unit: timedelta) -> datetime:
    return floor_day(t) if unit == DAY else floor_hour(t)


def day_of(t: datetime) -> date:
    """The UTC date of `t`."""
    return t.astimezone(UTC).date()


def day_pieces(start: datetime, end: datetime) -> list[tuple[date, datetime, datetime]]:
    """[start, end) cut at each midnight UTC: (day, piece start, piece end), none empty."""
    pieces: list[tuple[date, datetime, datetime]] = []
    cursor = start
    while cursor < end:
        next_midnight = floor_day(cursor) + DAY
        piece_end = min(end, next_midnight)
        pieces.append((day_of(cursor), cursor, piece_end))
        cursor = piece_end
    return pieces


@dataclass(frozen=True)
class Split:
    """[start, end) as whole periods [full_start, full_end) and partial edges, each inside
    one period."""

    full: tuple[datetime, datetime] | None
    edges: tuple[tuple[datetime, datetime], ...]


def split(start: datetime, end: datetime, unit: timedelta) -> Split:
    """Whole `unit`s (DAY or HOUR, aligned to UTC) inside [start, end), and what is left."""
    first = _ceil(start, unit)
    last = _floor(end, unit)
    if first > last:
        # Both ends inside one period, and neither on its boundary.
        return Split(None, ((start, end),) if start < end else ())
    edges = []
    if start < first:
        edges.append((start, first))
    if last < end:
        edges.append((last, end))
    return Split((first, last) if first < last else None, tuple(edges))


def overlap_s(start: datetime, end: datetime, lo: datetime, hi: datetime) -> float:
    """Seconds of [start, end) inside [lo, hi); never negative."""
    return max(0.0, (min(end, hi) - max(start, lo)).total_seconds())
