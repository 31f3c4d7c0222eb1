"""The chaos suite's checks catch what they are for: each invariant's violation, hand-made in a
record the way the bus would hold it, is found with its evidence, and the same record made
right passes. (A check that cannot fail would let a chaos run pass whatever happened.)"""

from __future__ import annotations

from tests.chaos import checks, convergence, metering
from tests.chaos.model import (
    Action,
    ApiView,
    DesiredValue,
    Event,
    Fault,
    FaultKind,
    LeaderBeat,
    Record,
    Report,
    Request,
    Row,
    Usage,
)
from tests.chaos.verdict import judge

T = 1_800_000_000.0
"""A wall-clock origin for hand-made records."""


def _value(seq: int, at: float, machine: str, gen: int, *rows: Row) -> DesiredValue:
    return DesiredValue(seq, T + at, machine, gen, tuple(rows))


def _run(workload: str, *gpus: str) -> Row:
    return Row(workload, "running", tuple(gpus))


def _event(
    workload: str,
    seq: int,
    state: str,
    at: float,
    machine: str | None = "m-a",
    *,
    reason: str = "",
    gpus: int = 1,
    cpus: float = 2.0,
) -> Event:
    return Event(
        stream_seq=seq,
        published=T + at,
        event_id=f"{workload}-{seq}",
        workload=workload,
        seq=seq,
        transition=True,
        state=state,
        reason=reason or f"{state} as asked",
        at=T + at,
        machine=machine,
        gpus=gpus,
        cpus=cpus,
        metered=state == "running",
    )


def _launch(workload: str, at: float = 0.0, key: str | None = None) -> Request:
    return Request(0, Action.create, workload, T + at, 201, T + at + 0.01, key=key)


# --- I1 -----------------------------------------------------------------------------------------


def test_i1_finds_a_workload_desired_running_on_two_machines_past_the_slack() -> None:
    values = [
        _value(1, 0.0, "m-a", 1, _run("w-1", "GPU-a0")),
        _value(2, 1.0, "m-b", 1, _run("w-1", "GPU-b0")),  # the deposed leader's write
        _value(3, 11.0, "m-a", 2),
    ]
    found = checks.one_machine(values, slack_s=2.0, end=T + 20)
    assert [(v.invariant, v.subject) for v in found] == [("I1", "w-1")]
    assert "running on 2 machines at once" in found[0].evidence
    assert "for 10.0 s" in found[0].evidence
    assert "m-a generation 1" in found[0].evidence
    assert "m-b generation 1" in found[0].evidence


def test_i1_lets_one_cycles_writes_overlap_within_the_slack_but_not_to_the_end() -> None:
    moved = [
        _value(1, 0.0, "m-a", 1, _run("w-1")),
        _value(2, 5.0, "m-b", 1, _run("w-1")),
        _value(3, 5.01, "m-a", 2, Row("w-1", "parked")),
    ]
    assert checks.one_machine(moved, slack_s=2.0, end=T + 20) == []
    stuck = moved[:2]
    found = checks.one_machine(stuck, slack_s=2.0, end=T + 6)
    assert len(found) == 1
    assert "still so at the end (1.0 s)" in found[0].evidence


def test_i1_finds_a_gpu_booked_twice_in_one_value_and_across_machines() -> None:
    twice = [_value(1, 0.0, "m-a", 1, _run("w-1", "GPU-0"), _run("w-2", "GPU-0"))]
    found = checks.one_machine(twice, slack_s=2.0, end=T + 1)
    assert len(found) == 1
    assert found[0].subject == "GPU-0"
    assert "booked to w-1 and to w-2 in one desired value" in found[0].evidence
    shared = [
        _value(1, 0.0, "m-a", 1, _run("w-1", "GPU-0")),
        _value(2, 0.0, "m-b", 1, Row("w-2", "parked", ("GPU-0",))),
    ]
    found = checks.one_machine(shared, slack_s=2.0, end=T + 10)
    assert [v.subject for v in found] == ["GPU-0"]
    assert "booked to several workloads at once" in found[0].evidence


# --- I4 -----------------------------------------------------------------------------------------


def test_i4_finds_a_generation_written_after_a_later_one_and_two_values_of_one() -> None:
    values = [
        _value(1, 0.0, "m-a", 10, _run("w-1")),
        _value(2, 1.0, "m-a", 8, _run("w-2")),  # a deposed leader's late write
        _value(3, 2.0, "m-a", 10, _run("w-1")),  # an audit's rewrite: the same value
        _value(4, 3.0, "m-a", 10, _run("w-3")),
    ]
    found = checks.generations_grow(values)
    assert [v.invariant for v in found] == ["I4", "I4"]
    assert "generation 8 written (seq 2" in found[0].evidence
    assert "after generation 10 (seq 1" in found[0].evidence
    assert "two values at generation 10" in found[1].evidence
    assert checks.generations_grow(values[:1] + values[2:3]) == []


# --- I3 -----------------------------------------------------------------------------------------


def _converged_record() -> Record:
    return Record(
        desired=[_value(1, 1.0, "m-a", 1, _run("w-1", "GPU-0"))],
        events=[_event("w-1", 1, "scheduled", 1.0), _event("w-1", 2, "running", 2.0)],
        requests=[_launch("w-1")],
        api={"w-1": ApiView("running", "m-a")},
        ended=T + 10,
    )


def test_i3_passes_a_converged_launch() -> None:
    assert convergence.converged(_converged_record()) == []


def test_i3_finds_a_lost_launch_an_unconverged_one_and_disagreeing_projections() -> None:
    record = _converged_record()
    record.requests.append(_launch("w-lost", 3.0))
    record.requests.append(Request(0, Action.park, "w-1", T + 4, 202, T + 4.01))
    record.api["w-1"] = ApiView("parking", "m-a")
    record.events.append(_event("w-1", 3, "parking", 4.1))
    found = {v.subject: v.evidence for v in convergence.converged(record)}
    assert found["w-lost"].startswith("no event of it on the bus: lost")
    assert found["w-1"].startswith(
        "park acknowledged at 08:00:04.010, yet its last state on the bus is parking (seq 3"
    )
    assert "asked [create 08:00:00.000→201, park 08:00:04.000→202]" in found["w-1"]
    assert "events [1:scheduled@08:00:01.000, 2:running@08:00:02.000, 3:parking@" in found["w-1"]
    # The F1 story: the store says parked, KV says running.
    record.events.append(_event("w-1", 4, "parked", 5.0))
    record.api["w-1"] = ApiView("parked", None)
    evidence = " | ".join(v.evidence for v in convergence.converged(record))
    assert "parked on the bus, but desired running on m-a generation 1" in evidence
    record.desired.append(_value(2, 5.0, "m-a", 2, Row("w-1", "parked")))
    record.requests.pop(1)  # w-lost
    assert convergence.converged(record) == []


def test_i3_counts_an_unanswered_request_as_possibly_done() -> None:
    record = _converged_record()
    record.requests.append(Request(0, Action.remove, "w-1", T + 4, None, None))
    record.events.append(_event("w-1", 3, "removed", 5.0))
    record.api["w-1"] = ApiView("removed", None)
    record.desired.append(_value(2, 5.0, "m-a", 2))
    assert convergence.converged(record) == []


def test_i3_finds_an_idempotency_key_that_made_two_workloads() -> None:
    record = _converged_record()
    record.requests = [_launch("w-1", key="k-1"), _launch("w-2", 1.0, key="k-1")]
    record.events.append(_event("w-2", 1, "failed", 2.0, machine=None, reason="no room"))
    record.api["w-2"] = ApiView("failed", None)
    found = convergence.converged(record)
    assert [(v.subject, v.evidence) for v in found] == [
        ("k-1", "one Idempotency-Key made 2 workloads: ['w-1', 'w-2']")
    ]


# --- I2 and I5 ----------------------------------------------------------------------------------


def test_i2_finds_usage_that_is_not_the_sum_of_the_allocations() -> None:
    events = [_event("w-1", 1, "running", 0.0, gpus=2), _event("w-1", 2, "parked", 3600.0)]
    allocations = metering.expected_allocations(events)
    right = {"w-1": Usage(gpu_hours=2.0, cpu_core_hours=2.0)}
    assert metering.usage_matches(allocations, right, T + 7200) == []
    wrong = {"w-1": Usage(gpu_hours=4.0, cpu_core_hours=2.0)}
    found = metering.usage_matches(allocations, wrong, T + 7200)
    assert len(found) == 1
    assert "accounting reports 4.000000 GPU-hours, its allocations make 2.000000" in (
        found[0].evidence
    )


def test_i2_finds_a_lost_machine_metered_past_its_last_report() -> None:
    reason = "machine lost: m-a has not reported for 12 s; its devices are released"
    reports = [Report(1, T + 0.0, "m-a"), Report(2, T + 2.0, "m-a")]
    late = [_event("w-1", 3, "failed", 18.0, reason=reason)]
    found = metering.lost_timed_from_last_report(late, reports, slack_s=2.0)
    assert len(found) == 1
    assert "16.0 s after the machine's last report" in found[0].evidence
    on_time = [_event("w-1", 3, "failed", 2.0, reason=reason)]
    assert metering.lost_timed_from_last_report(on_time, reports, slack_s=2.0) == []
    # Placed there after its last report (not yet suspect): closed where it opened, nothing
    # metered; closed any later, the time between is metered for nothing.
    placed_late = [
        _event("w-2", 1, "scheduled", 9.0),
        _event("w-2", 2, "failed", 9.0, reason=reason),
    ]
    assert metering.lost_timed_from_last_report(placed_late, reports, slack_s=2.0) == []
    closed_late = [
        _event("w-2", 1, "scheduled", 9.0),
        _event("w-2", 2, "failed", 15.0, reason=reason),
    ]
    assert len(metering.lost_timed_from_last_report(closed_late, reports, slack_s=2.0)) == 1


def test_i5_finds_allocations_closed_while_running_left_open_missing_or_extra() -> None:
    events = [
        _event("w-1", 1, "running", 0.0),
        _event("w-2", 1, "running", 0.0),
        _event("w-2", 2, "parked", 10.0),
    ]
    allocations = metering.expected_allocations(events)
    truth = [a for mine in allocations.values() for a in mine]
    assert metering.closed_once(allocations, truth) == []
    w1, w2 = sorted(truth, key=lambda a: a.workload)
    closed_early = w1.__class__(**{**w1.__dict__, "closed_by": "w-1-9", "ended_at": T + 1})
    left_open = w2.__class__(**{**w2.__dict__, "closed_by": None, "ended_at": None})
    extra = w1.__class__(**{**w1.__dict__, "opened_by": "w-1-7"})
    found = metering.closed_once(allocations, [closed_early, left_open, extra])
    evidence = " | ".join(str(v) for v in found)
    assert "I5 w-1: closed by w-1-9" in evidence
    assert "but the events leave it running" in evidence
    assert "I5 w-2: still open, but w-2-2 closed it" in evidence
    assert "allocation the events do not make" in evidence
    assert len(metering.closed_once(allocations, [w1])) == 1  # w-2's never opened


# --- I6 and takeovers ---------------------------------------------------------------------------


def test_i6_finds_preemption_twice_and_a_workload_moved_back_and_forth() -> None:
    events = [
        _event("w-1", 1, "scheduled", 0.0, machine="m-a"),
        _event("w-1", 2, "preempted", 10.0),
        _event("w-1", 3, "scheduled", 11.0, machine="m-b"),
        _event("w-1", 4, "preempted", 20.0),
        _event("w-1", 5, "scheduled", 21.0, machine="m-a"),
    ]
    found = checks.no_ping_pong(events, [_launch("w-1", -1.0)])
    assert [v.evidence.split(":")[0] for v in found] == [
        "preempted 2 times",
        "moved back and forth by itself",
    ]
    assert "m-a → m-b → m-a" in found[1].evidence
    # A resume asked in between places it anew: no ping-pong.
    resumed = Request(0, Action.resume, "w-1", T + 20.5, 202, T + 20.6)
    found = checks.no_ping_pong(events, [_launch("w-1", -1.0), resumed])
    assert [v.evidence.split(":")[0] for v in found] == ["preempted 2 times"]


def test_takeover_is_timed_from_the_loss_to_a_later_terms_first_heartbeat() -> None:
    kill = Fault(FaultKind.leader_kill, "scheduler-a", T + 10.0, 1.0, lost_term=3)
    stop = Fault(FaultKind.leader_stop, "scheduler-b", T + 30.0, 8.0, lost_term=4)
    beats = [
        LeaderBeat(1, T + 9.5, "local", "a", 3),
        LeaderBeat(2, T + 13.7, "local", "b", 4),
        LeaderBeat(3, T + 40.0, "local", "b", 4),  # the frozen leader, back: no takeover
    ]
    found = checks.takeovers([kill, stop], beats)
    assert [t.seconds is not None and round(t.seconds, 1) for t in found] == [3.7, False]
    slow = checks.slow_takeovers(found, limit_s=5.0)
    assert [v.subject for v in slow] == ["scheduler-b"]
    assert "no later term ever heartbeat" in slow[0].evidence
    assert checks.slow_takeovers(found[:1], limit_s=3.0)[0].evidence.endswith("(limit 3 s)")


def test_a_clean_record_passes_every_check() -> None:
    record = _converged_record()
    record.reports = [Report(1, T + 0.5, "m-a")]
    record.accounted = [
        a for mine in metering.expected_allocations(record.events).values() for a in mine
    ]
    record.usage = {"w-1": Usage(gpu_hours=8 / 3600, cpu_core_hours=16 / 3600)}
    record.usage_now = T + 10
    verdict = judge(record)
    assert verdict.violations == [], [str(v) for v in verdict.violations]
    assert verdict.passed
    assert set(verdict.by_invariant.values()) == {0}
