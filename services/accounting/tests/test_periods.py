"""Cutting time at UTC midnights and hours: what the day sums and report edges rely on."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta, timezone

from einsora.accounting.periods import DAY, HOUR, day_pieces, split


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_an_interval_is_cut_at_each_midnight_and_nothing_is_lost() -> None:
    start, end = utc(2030, 1, 30, 22, 15), utc(2030, 2, 2, 1, 5)
    pieces = day_pieces(start, end)
    assert [p[0] for p in pieces] == [
        date(2030, 1, 30),
        date(2030, 1, 31),
        date(2030, 2, 1),
        date(2030, 2, 2),
    ]
    assert pieces[0][1] == start
    assert pieces[-1][2] == end
    for (_, _, a_end), (_, b_start, _) in itertools.pairwise(pieces):
        assert a_end == b_start
    assert sum((b - a for _, a, b in pieces), timedelta()) == end - start
    assert day_pieces(end, end) == []


def test_midnight_is_utc_whatever_zone_a_time_is_written_in() -> None:
    # 23:30 in UTC-05:00 is 04:30 the next day in UTC.
    late = datetime(2030, 1, 1, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    [(day, _, _)] = day_pieces(late, late + timedelta(minutes=10))
    assert day == date(2030, 1, 2)


def test_a_range_splits_into_whole_periods_and_edges_inside_one_period_each() -> None:
    cases = [
        # (start, end, unit, full, edges)
        (utc(2030, 1, 1), utc(2030, 1, 4), DAY, (utc(2030, 1, 1), utc(2030, 1, 4)), ()),
        (
            utc(2030, 1, 1, 6),
            utc(2030, 1, 4, 18),
            DAY,
            (utc(2030, 1, 2), utc(2030, 1, 4)),
            ((utc(2030, 1, 1, 6), utc(2030, 1, 2)), (utc(2030, 1, 4), utc(2030, 1, 4, 18))),
        ),
        (
            utc(2030, 1, 1, 6),
            utc(2030, 1, 2, 18),
            DAY,
            None,
            ((utc(2030, 1, 1, 6), utc(2030, 1, 2)), (utc(2030, 1, 2), utc(2030, 1, 2, 18))),
        ),
        (
            utc(2030, 1, 1, 6),
            utc(2030, 1, 1, 9),
            DAY,
            None,
            ((utc(2030, 1, 1, 6), utc(2030, 1, 1, 9)),),
        ),
        (utc(2030, 1, 1), utc(2030, 1, 1, 9), DAY, None, ((utc(2030, 1, 1), utc(2030, 1, 1, 9)),)),
        (
            utc(2030, 1, 1, 6, 10),
            utc(2030, 1, 1, 8, 20),
            HOUR,
            (utc(2030, 1, 1, 7), utc(2030, 1, 1, 8)),
            (
                (utc(2030, 1, 1, 6, 10), utc(2030, 1, 1, 7)),
                (utc(2030, 1, 1, 8), utc(2030, 1, 1, 8, 20)),
            ),
        ),
    ]
    for start, end, unit, full, edges in cases:
        got = split(start, end, unit)
        assert (got.full, got.edges) == (full, edges), (start, end)
        covered = sum((b - a for a, b in got.edges), timedelta())
        if got.full is not None:
            covered += got.full[1] - got.full[0]
        assert covered == end - start
