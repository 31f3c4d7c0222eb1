"""Which workloads the cell may run elsewhere once their machine is lost (ADR-0029).

Those with a fallback chain (their owner opted in to running somewhere else), and an endpoint's
replicas (the others take its traffic, and it is a copy of them). The desired state says so of
each (`DesiredWorkload.replaceable`), because the agent of a machine that is cut off from the
control plane must decide alone: it stops these after its fence time, before the scheduler's
`lost_after` can place them again, and keeps the others, which the scheduler only fails
(stopping them would lose work for nothing).
"""

from __future__ import annotations

from einsora.common.schemas import WorkloadKind
from einsora.scheduler.model import Workload


def replaceable(workload: Workload) -> bool:
    """Whether the cell may run `workload` elsewhere once its machine is lost."""
    if workload.chain is not None:
        return True
    if workload.kind is not WorkloadKind.endpoint:
        return False
    replicas = workload.spec.get("replicas", 1)
    return isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 1
