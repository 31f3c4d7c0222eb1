"""A run's outcome for people: a table of what was done and found, each violation's evidence,
each unexpected exit, each leader loss's takeover; the figures as JSON are the caller's last
line (`bench/chaos.py`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tests.chaos.checks import INVARIANTS, TAKEOVER, Violation
from tests.chaos.model import clock
from tests.chaos.run import Outcome

EVIDENCE_PER_INVARIANT = 8
"""Violations printed in full per invariant (the rest are counted)."""


def rows(outcome: Outcome) -> list[tuple[str, str]]:
    f = outcome.figures
    counts = f["violations"]
    taken = ", ".join("none" if t is None else f"{t:.2f} s" for t in f["takeover_s"]) or "-"
    return [
        ("form, seed", f"{f['form']}, {f['seed']}"),
        (
            "cell",
            f"3 NATS nodes (R3), Postgres, api, 2 schedulers, accounting, {f['machines']} machines",
        ),
        ("launches acknowledged", str(f["launches"])),
        (
            "requests (acknowledged, unanswered)",
            f"{f['requests']} ({f['acknowledged']}, {f['unanswered']})",
        ),
        ("faults", f"{f['faults']}: " + "; ".join(f["fault_kinds"])),
        ("leader losses: takeover", f"{f['leader_losses']}: {taken}"),
        (
            "converged after the last fault",
            "not within the bound" if f["converge_s"] is None else f"{f['converge_s']} s",
        ),
        (
            "record",
            f"{f['desired_values']} desired values, {f['events']} events, "
            f"{f['allocations']} allocations, {f['workloads_checked']} workloads asked; "
            f"{f['mirror_gaps']} values missed by the mirror",
        ),
        ("services that exited by themselves", ", ".join(f["unexpected_exits"]) or "none"),
        *((f"violations of {name}", str(counts.get(name, 0))) for name in (*INVARIANTS, TAKEOVER)),
        ("run", f"{f['run_s']} s; logs in {outcome.directory / 'logs'}"),
        ("verdict", "PASSED" if f["passed"] else "FAILED"),
    ]


def evidence(outcome: Outcome) -> list[str]:
    """Every violation (the first few per invariant in full) and every unexpected exit."""
    lines: list[str] = []
    by: defaultdict[str, list[Violation]] = defaultdict(list)
    for v in outcome.verdict.violations:
        by[v.invariant].append(v)
    for name, found in by.items():
        lines.append(f"{name}: {len(found)} violation(s)")
        lines.extend(f"  {v}" for v in found[:EVIDENCE_PER_INVARIANT])
        if len(found) > EVIDENCE_PER_INVARIANT:
            lines.append(f"  … and {len(found) - EVIDENCE_PER_INVARIANT} more")
    for e in outcome.exits:
        lines.append(f"{e.name} exited by itself (status {e.code}) at {clock(e.at)}; its log ends:")
        lines.extend(f"    {line}" for line in e.tail.splitlines()[-6:])
    spans = outcome.record.mirror_gap_spans
    if spans:
        lines.append(
            f"the record misses {outcome.record.mirror_gaps} values of the machines bucket "
            f"(the mirror fell behind while they were replaced), from {clock(spans[0][0])} to "
            f"{clock(spans[-1][1])}: I1 and I4 are blind to what was there"
        )
    for fault in outcome.record.faults:
        if fault.note:
            lines.append(f"{fault.kind.value} of {fault.target} at {clock(fault.at)}: {fault.note}")
    return lines


def table(name: str, table_rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in table_rows)
    return "\n".join([name, *(f"  {label.ljust(width)}  {value}" for label, value in table_rows)])
