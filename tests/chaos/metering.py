"""I2 and I5: what accounting metered, against the allocations the bus's events make.

The truth is the events, each workload's in the scheduler's own order (`seq`): a transition
into `running` that says what the workload holds opens an allocation at the event's `at`,
unless one is open; any other transition closes it at its `at` (accounting's rule, ADR-0012
and `einsora.accounting.metering`, applied here to the bus's record rather than to what
accounting happened to receive, in whatever order).
- I2: accounting's usage report, per workload, equals those allocations' GPU-hours and
  CPU-core-hours (open ones counted to the report's `now`); and a machine lost to silence
  closes its workloads' allocations at its last report on the bus, not later.
- I5: accounting holds exactly those allocations, each opened and closed by the same events:
  none missing, none extra, none closed that runs on, none left open that was closed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

from tests.chaos.checks import Violation
from tests.chaos.model import Allocation, Event, Report, Usage, clock

LOST_REASON = re.compile(r"^machine lost: (\S+) has not reported")
"""The scheduler's reason when a machine's silence fails its workloads (`reasons.lost`)."""

HOURS_TOLERANCE = 1e-6
"""Rounding between accounting's SQL sums and these (an hour is 3,600 s: about 4 ms)."""


def expected_allocations(events: Iterable[Event]) -> dict[str, list[Allocation]]:
    """Each workload's allocations, as its events make them."""
    by_workload: defaultdict[str, dict[int, Event]] = defaultdict(dict)
    for e in events:
        if e.transition:
            by_workload[e.workload].setdefault(e.seq, e)
    made: dict[str, list[Allocation]] = {}
    for workload, mine in by_workload.items():
        allocations: list[Allocation] = []
        current: Allocation | None = None
        for _, e in sorted(mine.items()):
            if e.state == "running":
                if current is None and e.metered:
                    current = Allocation(workload, e.event_id, e.at, e.gpus, e.cpus)
            elif current is not None:
                allocations.append(
                    Allocation(
                        workload,
                        current.opened_by,
                        current.started_at,
                        current.gpus,
                        current.cpus,
                        closed_by=e.event_id,
                        ended_at=max(e.at, current.started_at),
                    )
                )
                current = None
        if current is not None:
            allocations.append(current)
        made[workload] = allocations
    return made


def _hours(allocations: Sequence[Allocation], now: float) -> tuple[float, float]:
    gpu = cpu = 0.0
    for a in allocations:
        end = a.ended_at if a.ended_at is not None else now
        held = max(0.0, end - a.started_at) / 3600
        gpu += a.gpus * held
        cpu += a.cpus * held
    return gpu, cpu


def usage_matches(
    expected: dict[str, list[Allocation]], usage: dict[str, Usage], now: float
) -> list[Violation]:
    """I2: accounting's report per workload equals the events' allocations."""
    found = []
    for workload in sorted(set(expected) | set(usage)):
        gpu, cpu = _hours(expected.get(workload, []), now)
        got = usage.get(workload, Usage(0.0, 0.0))
        for what, want, have in (
            ("GPU-hours", gpu, got.gpu_hours),
            ("CPU-core-hours", cpu, got.cpu_core_hours),
        ):
            if abs(want - have) > HOURS_TOLERANCE + 1e-6 * abs(want):
                allocations = "; ".join(_allocation(a) for a in expected.get(workload, []))
                found.append(
                    Violation(
                        "I2",
                        workload,
                        f"accounting reports {have:.6f} {what}, its allocations make "
                        f"{want:.6f} ({allocations or 'none'})",
                    )
                )
    return found


def lost_timed_from_last_report(
    events: Sequence[Event], reports: Sequence[Report], slack_s: float
) -> list[Violation]:
    """I2: a workload failed by its machine's silence stops being metered at the machine's last
    report the bus stored before the failure, within `slack_s`: not at some later instant
    (a takeover's book load, say), which would meter time nothing was seen running. One placed
    there after that report (the machine not yet suspect) is closed where it opened: nothing
    is metered for it, and an allocation never ends before it began."""
    opened: defaultdict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.transition:
            opened[e.workload].append(e)
    by_machine: defaultdict[str, list[Report]] = defaultdict(list)
    for r in reports:
        by_machine[r.machine].append(r)
    for mine in by_machine.values():
        mine.sort(key=lambda r: r.seq)
    found = []
    for e in events:
        match = LOST_REASON.match(e.reason) if e.transition and e.state == "failed" else None
        if match is None:
            continue
        machine = match.group(1)
        before = [r for r in by_machine.get(machine, []) if r.at <= e.published]
        if not before:
            continue
        last = before[-1]
        earlier = [o.at for o in opened[e.workload] if o.seq < e.seq]
        since = max(last.at, max(earlier, default=last.at))
        if e.at - since > slack_s:
            found.append(
                Violation(
                    "I2",
                    e.workload,
                    f"failed as {machine} was lost, its allocation closed at {clock(e.at)}, "
                    f"{e.at - last.at:.1f} s after the machine's last report on the bus "
                    f"({clock(last.at)}): metered for time nothing reported",
                )
            )
    return found


def closed_once(
    expected: dict[str, list[Allocation]], accounted: Sequence[Allocation]
) -> list[Violation]:
    """I5: accounting's allocations are the events' allocations, each closed exactly once, by
    the event that closes it."""
    found = []
    truth = {a.opened_by: a for allocations in expected.values() for a in allocations}
    held: defaultdict[str, list[Allocation]] = defaultdict(list)
    for a in accounted:
        held[a.opened_by].append(a)
    for opened_by, rows in sorted(held.items()):
        if opened_by not in truth:
            found.append(
                Violation(
                    "I5",
                    rows[0].workload,
                    "accounting holds an allocation the events do not make: "
                    + _allocation(rows[0]),
                )
            )
        elif len(rows) > 1:
            found.append(
                Violation("I5", rows[0].workload, f"opened {len(rows)} times by {opened_by}")
            )
    for opened_by, want in sorted(truth.items()):
        have_rows = held.get(opened_by)
        if not have_rows:
            found.append(
                Violation("I5", want.workload, f"never opened in accounting: {_allocation(want)}")
            )
            continue
        have = have_rows[0]
        if want.closed_by is None and have.closed_by is not None:
            found.append(
                Violation(
                    "I5",
                    want.workload,
                    f"closed by {have.closed_by} at {clock(have.ended_at or 0)}, but the events "
                    f"leave it running: {_allocation(want)}",
                )
            )
        elif want.closed_by is not None and have.closed_by != want.closed_by:
            found.append(
                Violation(
                    "I5",
                    want.workload,
                    f"{'still open' if have.closed_by is None else 'closed by ' + have.closed_by}"
                    f", but {want.closed_by} closed it: {_allocation(want)}",
                )
            )
    return found


def _allocation(a: Allocation) -> str:
    end = "open" if a.ended_at is None else f"to {clock(a.ended_at)} ({a.closed_by})"
    return f"{a.gpus} GPUs, {a.cpus:g} cores from {clock(a.started_at)} ({a.opened_by}) {end}"
