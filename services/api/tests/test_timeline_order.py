"""Events apply in the order of their `seq`, whatever order they arrive in (issue 35, F6).

An api SIGKILLed while it holds unacked events gets them again only after the consumer's ack
wait, by which time the workload's later events have come and gone: its `scheduled` event,
the only one that carries the placement, then arrives after `starting` and `running`. It moves
no state back, yet its placement is kept when no later event placed the workload elsewhere,
and the timeline shows it where its `seq` puts it.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from einsora.api.services.timeline import apply_events
from einsora.api.testing import RunningApi, eventually
from einsora.common.bus import names, publish
from einsora.common.schemas import EventKind, Placement, WorkloadEvent, WorkloadState, utcnow
from einsora.common.testing import Bus

RUN = secrets.token_hex(4)


def _event(
    workload: dict[str, Any],
    seq: int,
    state: WorkloadState,
    *,
    at: datetime,
    kind: EventKind = EventKind.transition,
    placement: Placement | None = None,
) -> WorkloadEvent:
    return WorkloadEvent(
        event_id=f"{workload['id']}-{seq}-{RUN}",
        workload_id=workload["id"],
        tenant_id=workload["tenant_id"],
        kind=kind,
        state=state,
        reason=f"seq {seq}",
        seq=seq,
        at=at,
        placement=placement,
    )


def _placed(machine: str) -> Placement:
    return Placement(region="local", machine=machine, placed_class="cpu-1c-2g")


async def _launch(api: RunningApi) -> dict[str, Any]:
    answer = await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    assert answer.status == 201, answer.text
    body: dict[str, Any] = answer.body
    return body


async def _timeline(api: RunningApi, workload_id: str, limit: int = 100) -> list[dict[str, Any]]:
    """Every entry of the timeline, page by page."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": str(limit)} | ({"cursor": cursor} if cursor else {})
        page = (await api.owner.get(f"/v1/workloads/{workload_id}/events", params=params)).body
        entries.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return entries


async def test_a_scheduled_event_after_starting_and_running_still_places_the_workload(
    api: RunningApi, bus: Bus
) -> None:
    """On the bus, as a redelivery after an api restart brings it."""
    workload = await _launch(api)
    t0 = utcnow()
    scheduled = _event(workload, 1, WorkloadState.scheduled, at=t0, placement=_placed("m-sched"))
    starting = _event(workload, 2, WorkloadState.starting, at=t0 + timedelta(seconds=1))
    running = _event(workload, 3, WorkloadState.running, at=t0 + timedelta(seconds=2))
    for event in (starting, running, scheduled):
        await publish(
            bus.js,
            names.event_subject(event.workload_id),
            event,
            request_id="req-late",
            msg_id=event.event_id,
        )

    async def all_in() -> bool:
        return len(await _timeline(api, workload["id"])) == 4

    await eventually(all_in, what="the three events in the timeline")
    shown = (await api.owner.get(f"/v1/workloads/{workload['id']}")).body
    assert shown["state"] == "running"
    assert shown["placement"] is not None, "the late scheduled event's placement was lost"
    assert shown["placement"]["machine"] == "m-sched"
    states = [e["state"] for e in await _timeline(api, workload["id"])]
    assert states == ["pending", "scheduled", "starting", "running"]


async def test_the_latest_placement_wins_whatever_order_its_events_came_in(
    api_on_store: RunningApi,
) -> None:
    """A late event's placement is taken when it is the latest that carried one, and only then,
    whether the events come in one batch or in many (on both engines)."""
    api = api_on_store
    store = api.service.store
    assert store is not None
    t0 = utcnow()

    def at(s: int) -> datetime:
        return t0 + timedelta(seconds=s)

    # 1. One batch, in reverse: applied as if in seq order.
    one = await _launch(api)
    batch = [
        _event(one, 3, WorkloadState.running, at=at(3)),
        _event(one, 2, WorkloadState.starting, at=at(2)),
        _event(one, 1, WorkloadState.scheduled, at=at(1), placement=_placed("m-one")),
    ]
    assert await apply_events(store, [(e, None) for e in batch]) == [True, True, True]

    # 2. Placed, parked, resumed and placed again; the first placement arrives last of all.
    two = await _launch(api)
    first = _event(two, 1, WorkloadState.scheduled, at=at(1), placement=_placed("m-first"))
    later = [
        _event(two, 2, WorkloadState.running, at=at(2)),
        _event(two, 3, WorkloadState.parking, at=at(3)),
        _event(two, 4, WorkloadState.parked, at=at(4)),
        _event(two, 5, WorkloadState.pending, at=at(5)),
        _event(two, 6, WorkloadState.scheduled, at=at(6), placement=_placed("m-second")),
        _event(two, 7, WorkloadState.running, at=at(7)),
    ]
    await apply_events(store, [(e, None) for e in later])
    assert await apply_events(store, [(first, None)]) == [True]

    # 3. Its re-placement (seq 6) arrives after seq 7, the first placement (seq 1) long before.
    three = await _launch(api)
    early = [
        _event(three, 1, WorkloadState.scheduled, at=at(1), placement=_placed("m-old")),
        _event(three, 2, WorkloadState.running, at=at(2)),
        _event(three, 3, WorkloadState.parking, at=at(3)),
        _event(three, 4, WorkloadState.parked, at=at(4)),
        _event(three, 5, WorkloadState.pending, at=at(5)),
        _event(three, 7, WorkloadState.running, at=at(7)),
    ]
    await apply_events(store, [(e, None) for e in early])
    replaced = _event(three, 6, WorkloadState.scheduled, at=at(6), placement=_placed("m-new"))
    assert await apply_events(store, [(replaced, None)]) == [True]
    # Seen again (a redelivery): nothing changes.
    assert await apply_events(store, [(replaced, None), (early[0], None)]) == [False, False]

    for workload, machine in ((one, "m-one"), (two, "m-second"), (three, "m-new")):
        shown = (await api.owner.get(f"/v1/workloads/{workload['id']}")).body
        assert shown["state"] == "running", workload["id"]
        assert shown["placement"] is not None, workload["id"]
        assert shown["placement"]["machine"] == machine, workload["id"]
    reasons = [e["reason"] for e in await _timeline(api, two["id"])]
    assert reasons == ["created by owner"] + [f"seq {s}" for s in range(1, 8)]


async def test_the_timeline_is_in_sequence_order_whatever_the_times_say(
    api_on_store: RunningApi,
) -> None:
    """Times do not follow `seq` everywhere: one agent's report times two transitions alike,
    a lost machine's events are timed at its last heartbeat (before the note that it went
    quiet), and a scheduler that took over has a clock of its own. The timeline follows `seq`,
    and the api's own entries keep their place by time; every page agrees."""
    api = api_on_store
    store = api.service.store
    assert store is not None
    workload = await _launch(api)
    t0 = utcnow() + timedelta(seconds=1)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    events = [
        _event(workload, 1, WorkloadState.scheduled, at=at(0), placement=_placed("m-1")),
        _event(workload, 2, WorkloadState.starting, at=at(5)),
        _event(workload, 3, WorkloadState.running, at=at(5)),  # the same report
        _event(workload, 4, WorkloadState.running, at=at(60), kind=EventKind.note),  # quiet
        _event(workload, 5, WorkloadState.failed, at=at(30)),  # at its last heartbeat
        _event(workload, 6, WorkloadState.pending, at=at(20)),  # another scheduler's clock
        _event(workload, 7, WorkloadState.scheduled, at=at(21), placement=_placed("m-2")),
    ]
    # Arriving one at a time, in an order of their own.
    for i in (2, 0, 1, 3, 6, 4, 5):
        await apply_events(store, [(events[i], None)])
    expected = ["created by owner"] + [f"seq {s}" for s in range(1, 8)]
    assert [e["reason"] for e in await _timeline(api, workload["id"])] == expected
    assert [e["reason"] for e in await _timeline(api, workload["id"], limit=1)] == expected
    assert [e["reason"] for e in await _timeline(api, workload["id"], limit=3)] == expected
    shown = (await api.owner.get(f"/v1/workloads/{workload['id']}")).body
    assert shown["state"] == "scheduled"
    assert shown["placement"]["machine"] == "m-2"
