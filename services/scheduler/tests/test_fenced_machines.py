"""What the scheduler tells an agent so that it can fence itself, and what it shows of it
(ADR-0029): a desired entry says whether the workload may run elsewhere once its machine is lost,
and a machine back from being lost whose agent stopped a workload itself has its account on
the timeline, once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.common.schemas import FallbackStep, WorkloadKind, WorkloadState, utcnow
from einsora.scheduler.model import Chain, Workload
from einsora.scheduler.replaceable import replaceable

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

FENCED = "stopped by its agent after 90 s without the control plane (it may run elsewhere now)"


def _workload(kind: WorkloadKind = WorkloadKind.notebook, **spec: object) -> Workload:
    return Workload(
        workload_id="w-1",
        tenant_id="t-1",
        region="local",
        kind=kind,
        class_name="l40s-48gb",
        count=1,
        spec=dict(spec),
        state=WorkloadState.running,
        access_token="token",
        created_at=utcnow(),
        name="chat",
    )


def test_what_may_run_elsewhere_is_what_has_a_chain_or_replicas() -> None:
    assert not replaceable(_workload())
    chained = _workload()
    chained.chain = Chain(steps=[FallbackStep.model_validate({"class": "a100-80gb"})])
    assert replaceable(chained)
    assert replaceable(_workload(WorkloadKind.endpoint, replicas=2))
    assert not replaceable(_workload(WorkloadKind.endpoint, replicas=1))
    assert not replaceable(_workload(WorkloadKind.endpoint))
    assert not replaceable(_workload(replicas=2))  # only an endpoint has replicas


async def test_desired_entries_say_which_workloads_may_run_elsewhere(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await start_scheduler(sqlite_url)
    plain = await sim.launch()
    chained = await sim.launch(fallback=[{"class": "a100-80gb"}])
    await sim.wait_state(plain, "scheduled")
    await sim.wait_state(chained, "scheduled")
    assert sim.entry("m-1", plain).replaceable is False  # type: ignore[union-attr]
    assert sim.entry("m-1", chained).replaceable is True  # type: ignore[union-attr]
    value = sim.desired["m-1"].to_bytes()  # type: ignore[union-attr]
    assert value.count(b'"replaceable"') == 1, "said only where it is so"


async def test_a_machine_back_from_being_lost_says_its_agent_stopped_a_workload(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    # The machine joins a running scheduler, so its silence counts from now: joined before the
    # start, a slow start alone (CI's, on a busy host) made it suspect before the launch.
    await start_scheduler(sqlite_url, suspect_after_s=0.6, lost_after_s=1.5)
    await sim.join("m-1", gpus=1)
    workload = await sim.launch(fallback=[{"class": "a100-80gb"}])
    await sim.wait_state(workload, "scheduled")
    await sim.report("m-1", {workload: "running"})
    await sim.wait_state(workload, "running")
    lost = await sim.wait_state(workload, "failed", within_s=5)
    assert lost.reason.startswith("machine lost: m-1 has not reported for ")

    # Back, having applied the desired state that parks it there: its agent's account.
    await sim.until(
        lambda: sim.entry_if("m-1", workload, lambda e: e.target.value == "parked"),
        what="parked there",
    )
    for _ in range(3):  # heartbeats say it again; the timeline says it once
        await sim.report("m-1", {workload: "failed"}, reasons={workload: FENCED})

    def accounts() -> list[str]:
        return [
            e.reason
            for e in sim.events.get(workload, [])
            if e.kind.value == "transition" and FENCED in e.reason
        ]

    [account] = await sim.until(accounts, what="the agent's account")
    assert account == (
        f"failed on m-1 while it was cut off from the control plane: {FENCED}; resume it to "
        "place it again"
    )
    await sim.until(lambda: len(sim.notes(workload)) >= 2, what="back note")
    assert accounts() == [account]
    assert sim.state(workload) == "failed"


async def test_a_machine_back_before_it_was_lost_fails_what_its_agent_stopped(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await start_scheduler(sqlite_url, suspect_after_s=0.5, lost_after_s=60)
    await sim.join("m-1", gpus=1)  # into a running scheduler: silent from now, not from before
    workload = await sim.launch(fallback=[{"class": "a100-80gb"}])
    await sim.wait_state(workload, "scheduled")
    await sim.report("m-1", {workload: "running"})
    await sim.wait_state(workload, "running")
    await sim.until(lambda: sim.notes(workload), within_s=5, what="suspect note")
    await sim.report("m-1", {workload: "failed"}, reasons={workload: FENCED})
    failed = await sim.wait_state(workload, "failed")
    assert failed.reason == f"failed on m-1: {FENCED}"
