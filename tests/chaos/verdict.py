"""Every check over one run's record, and what it comes to: the violations by invariant, and
each leader loss's takeover."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.chaos import checks, convergence, metering
from tests.chaos.checks import INVARIANTS, TAKEOVER, Takeover, Violation
from tests.chaos.model import Record


@dataclass(frozen=True)
class Limits:
    """How much each check tolerates, in seconds."""

    overlap_s: float = 2.0
    """I1: how long two machines' values may overlap while one cycle's writes reach the bus."""
    lost_s: float = 2.0
    """I2: a lost machine's allocations close this close to its last report."""
    takeover_s: float = 5.0
    """A leader loss is taken over within this (issue 35's bound)."""


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    takeovers: list[Takeover] = field(default_factory=list)

    @property
    def by_invariant(self) -> dict[str, int]:
        counts = dict.fromkeys((*INVARIANTS, TAKEOVER), 0)
        for v in self.violations:
            counts[v.invariant] = counts.get(v.invariant, 0) + 1
        return counts

    @property
    def passed(self) -> bool:
        return not self.violations


def judge(record: Record, limits: Limits | None = None) -> Verdict:
    """Run every check over `record`."""
    limits = limits or Limits()
    allocations = metering.expected_allocations(record.events)
    found = [
        *checks.one_machine(record.desired, slack_s=limits.overlap_s, end=record.ended),
        *metering.usage_matches(allocations, record.usage, record.usage_now),
        *metering.lost_timed_from_last_report(record.events, record.reports, limits.lost_s),
        *convergence.converged(record),
        *checks.generations_grow(record.desired),
        *metering.closed_once(allocations, record.accounted),
        *checks.no_ping_pong(record.events, record.requests),
    ]
    taken = checks.takeovers(record.faults, record.leader)
    found.extend(checks.slow_takeovers(taken, limits.takeover_s))
    return Verdict(found, taken)
