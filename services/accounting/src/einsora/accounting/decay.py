"""Fair share's decayed usage: each GPU-second weighted by 2^(-age / half-life).

A GPU held over [a, b] counts, at time `at`, the integral of the weight over the interval,
worked out exactly (no sampling):

    ∫_a^b 2^(-(at - t)/H) dt = H/ln 2 · (2^(-(at - b)/H) - 2^(-(at - a)/H))

with times and H in hours, so the result is in GPU-hours. A sum of such terms decays as a
whole: moving it from `since` to `at` multiplies it by 2^(-(at - since)/H). That is what lets
accounting keep one figure per tenant, updated as each allocation closes, instead of
re-reading every allocation (Slurm's decayed usage U, with PriorityDecayHalfLife = H).
"""

from __future__ import annotations

import math
from datetime import datetime

_LN2 = math.log(2.0)
_HOUR_S = 3600.0


def _hours(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds() / _HOUR_S


def decay(value: float, since: datetime, at: datetime, half_life_h: float) -> float:
    """`value` (decayed as of `since`) decayed on to `at`; never grown back to an earlier
    `at` (clocks that disagree must not inflate usage, nor overflow)."""
    if at <= since:
        return value
    return value * math.pow(2.0, -_hours(at, since) / half_life_h)


def decayed_gpu_hours(
    gpus: float, start: datetime, end: datetime, at: datetime, half_life_h: float
) -> float:
    """`gpus` held over [start, end), weighted as of `at` (0 for an empty interval). Time
    after `at` counts as nothing yet: no weight is ever above 1."""
    start, end = min(start, at), min(end, at)
    if end <= start or gpus == 0:
        return 0.0
    newest = math.pow(2.0, -_hours(at, end) / half_life_h)
    oldest = math.pow(2.0, -_hours(at, start) / half_life_h)
    return gpus * half_life_h / _LN2 * (newest - oldest)
