"""The converging rules, as plain data: a goal for every listed and every known workload."""

from __future__ import annotations

from einsora.agent.converge import Goal, plan
from einsora.common.schemas import DesiredState, DesiredWorkload, Target, WorkloadKind


def _w(workload_id: str, target: Target) -> DesiredWorkload:
    return DesiredWorkload(
        workload_id=workload_id,
        tenant_id="t-1",
        kind=WorkloadKind.notebook,
        class_name="cpu-1c-2g",
        target=target,
    )


def test_targets_become_goals_and_unlisted_known_workloads_are_dropped() -> None:
    desired = DesiredState(
        machine_id="m-1",
        generation=4,
        workloads=[_w("w-a", Target.running), _w("w-b", Target.parked), _w("w-c", Target.removed)],
    )
    result = plan(desired, ["w-a", "w-old"])
    goals = {a.workload_id: a.goal for a in result.assignments}
    assert goals == {"w-a": Goal.run, "w-b": Goal.park, "w-c": Goal.remove, "w-old": Goal.drop}
    assert next(a for a in result.assignments if a.workload_id == "w-old").desired is None
    assert result.invalid == ()


def test_ids_that_cannot_name_a_directory_are_refused() -> None:
    desired = DesiredState(
        machine_id="m-1",
        generation=1,
        workloads=[
            _w("../etc", Target.running),
            _w("w-ok", Target.running),
            _w("a b", Target.running),
        ],
    )
    result = plan(desired, [])
    assert [a.workload_id for a in result.assignments] == ["w-ok"]
    assert result.invalid == ("../etc", "a b")


def test_a_workload_listed_twice_takes_the_last_entry() -> None:
    desired = DesiredState(
        machine_id="m-1",
        generation=1,
        workloads=[_w("w-a", Target.running), _w("w-a", Target.parked)],
    )
    assert [(a.workload_id, a.goal) for a in plan(desired, []).assignments] == [("w-a", Goal.park)]
