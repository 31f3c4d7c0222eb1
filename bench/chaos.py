"""Chaos: a Lab cell of processes under seeded faults, its invariants checked from the bus.

Builds the cell as docs/lab.md does, with processes for containers (3 NATS nodes R3 with the
auth callout, one fresh Postgres database, the api, two schedulers sharing the region's lease,
accounting, sim agents and joined agents), drives a seeded mix of launches, parks, resumes and
removes from several clients while it SIGKILLs and SIGSTOPs every service, a NATS node and
agents, and partitions an agent past `lost_after`; then waits for convergence and checks
I1–I6 (DESIGN.md) from the bus's own record, and times every leader loss's takeover.

    .venv/bin/python bench/chaos.py                  # the short form, seed 1 (make test-chaos)
    .venv/bin/python bench/chaos.py --long --seeds 3 # 1,000 launches and 12 faults, 3 seeds

Each run prints its table and every violation's evidence; the last line is one JSON object of
figures (launches, faults, violations by invariant, takeover_s_max, converge_s_max, …). A
violation fails the run (exit status 1); a failed run's logs are kept and named.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import DEFAULT_POSTGRES, fresh_postgres, report
from tests.chaos import report as chaos_report
from tests.chaos.checks import INVARIANTS, TAKEOVER
from tests.chaos.run import LONG, SHORT, Outcome, run


async def _runs(args: argparse.Namespace) -> list[Outcome]:
    form = LONG if args.long else SHORT
    outcomes = []
    for seed in range(args.seed, args.seed + args.seeds):
        directory = Path(tempfile.mkdtemp(prefix=f"einsora-chaos-{form.name}-{seed}-"))
        async with fresh_postgres(args.postgres) as database:
            outcome = await run(form, seed, directory, database)
        print(chaos_report.table(f"chaos run {seed}", chaos_report.rows(outcome)))
        for line in chaos_report.evidence(outcome):
            print(line)
        print(flush=True)
        if outcome.verdict.passed and not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        outcomes.append(outcome)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="1,000 launches and 12 faults a run")
    parser.add_argument("--seeds", type=int, default=1, help="runs, one seed each (default 1)")
    parser.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, metavar="URL")
    parser.add_argument("--keep", action="store_true", help="keep every run's logs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    outcomes = asyncio.run(_runs(args))
    runs = [o.figures for o in outcomes]
    violations = {
        name: sum(f["violations"].get(name, 0) for f in runs) for name in (*INVARIANTS, TAKEOVER)
    }
    takeovers = [f["takeover_s_max"] for f in runs if f["takeover_s_max"] is not None]
    converged = [f["converge_s"] for f in runs]
    figures = {
        "form": runs[0]["form"],
        "seeds": [f["seed"] for f in runs],
        "machines": runs[0]["machines"],
        "launches": sum(f["launches"] for f in runs),
        "faults": sum(f["faults"] for f in runs),
        "leader_losses": sum(f["leader_losses"] for f in runs),
        "violations": violations,
        "violations_total": sum(violations.values()),
        "takeover_s_max": max(takeovers) if takeovers else None,
        "converge_s_max": None if None in converged else max(converged),
        "unexpected_exits": sum(len(f["unexpected_exits"]) for f in runs),
        "run_s_total": round(sum(f["run_s"] for f in runs), 1),
        "passed": all(f["passed"] for f in runs),
        "runs": runs,
    }
    report(
        "chaos",
        [
            ("form, seeds", f"{figures['form']}, {figures['seeds']}"),
            ("launches, faults", f"{figures['launches']}, {figures['faults']}"),
            ("violations by invariant", str(violations)),
            (
                "leader losses; slowest takeover",
                f"{figures['leader_losses']}; {figures['takeover_s_max']} s",
            ),
            ("slowest convergence", f"{figures['converge_s_max']} s"),
            ("wall time", f"{figures['run_s_total']} s"),
            ("verdict", "PASSED" if figures["passed"] else "FAILED"),
        ],
        figures,
    )
    sys.exit(0 if figures["passed"] else 1)


if __name__ == "__main__":
    main()
