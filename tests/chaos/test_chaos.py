"""The chaos suite's short form (`make test-chaos`; .ci/run runs it): a Lab cell of processes,
at least 300 launches with parks, resumes and removes from several clients, at least 6 seeded
faults (always the leader's SIGKILL and an agent partitioned past `lost_after`), then I1–I6
from the bus's own record and every leader loss taken over within 5 s.

`EINSORA_CHAOS_SEED` picks the seed (default 1). The table, every violation's evidence and the
figures as JSON are printed (`-s`); `bench/chaos.py --long --seeds 3` is the long form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.chaos import report
from tests.chaos.run import SHORT, run

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1200)]


async def test_a_lab_cell_keeps_its_promises_under_seeded_faults(
    postgres_url: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("EINSORA_CHAOS_SEED", "1"))
    outcome = await run(SHORT, seed, tmp_path / "cell", postgres_url)
    print()
    print(report.table(f"chaos run {seed}", report.rows(outcome)))
    evidence = report.evidence(outcome)
    print("\n".join(evidence))
    print(json.dumps(outcome.figures))
    assert outcome.figures["launches"] >= SHORT.launches
    assert outcome.figures["faults"] >= SHORT.faults
    assert outcome.verdict.passed, "\n".join(evidence)
