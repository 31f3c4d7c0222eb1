"""Workload events into the timeline: each event once, state and placement from the newest."""

from __future__ import annotations

import secrets

from einsora.api.services.timeline import apply_event, apply_events
from einsora.api.testing import RunningApi, eventually
from einsora.common.bus import names, publish
from einsora.common.schemas import EventKind, Placement, WorkloadEvent, WorkloadState
from einsora.common.testing import Bus

RUN = secrets.token_hex(4)


def _event(
    workload: dict[str, str],
    name: str,
    *,
    seq: int,
    state: WorkloadState,
    kind: EventKind = EventKind.transition,
    placement: Placement | None = None,
) -> WorkloadEvent:
    return WorkloadEvent(
        event_id=f"ev-{name}-{RUN}",
        workload_id=workload["id"],
        tenant_id=workload["tenant_id"],
        kind=kind,
        state=state,
        reason=f"{name} happened",
        seq=seq,
        placement=placement,
        request_id="req-from-scheduler",
    )


async def _send(bus: Bus, event: WorkloadEvent, msg_id: str) -> None:
    await publish(
        bus.js,
        names.event_subject(event.workload_id),
        event,
        request_id="req-from-scheduler",
        msg_id=f"{msg_id}-{RUN}",
    )


async def test_events_move_the_workload_and_fill_its_timeline_once(
    api: RunningApi, bus: Bus
) -> None:
    workload = (
        await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    ).body
    path = f"/v1/workloads/{workload['id']}"
    placed = Placement(region="local", machine="m-1", placed_class="cpu-1c-2g")
    scheduled = _event(
        workload, "scheduled", seq=1, state=WorkloadState.scheduled, placement=placed
    )
    await _send(bus, scheduled, "m1")
    # The same event published again (another message id, so JetStream keeps both).
    await _send(bus, scheduled, "m1-again")
    # An older event arriving late is recorded, but does not move the state back.
    await _send(bus, _event(workload, "late", seq=0, state=WorkloadState.queued), "m0")
    note = _event(workload, "note", seq=2, state=WorkloadState.scheduled, kind=EventKind.note)
    await _send(bus, note, "m2")

    async def all_in() -> bool:
        entries = (await api.owner.get(f"{path}/events")).body["items"]
        return any(e["reason"] == "note happened" for e in entries)

    await eventually(all_in)
    shown = (await api.owner.get(path)).body
    assert shown["state"] == "scheduled"
    assert shown["placement"] == {
        "region": "local",
        "machine": "m-1",
        "placed_class": "cpu-1c-2g",
        "host": None,  # m-1 is no other tenant's machine
    }
    entries = (await api.owner.get(f"{path}/events")).body["items"]
    reasons = [e["reason"] for e in entries]
    assert reasons.count("scheduled happened") == 1
    assert len(entries) == 4  # pending, scheduled, late, note
    assert [e["kind"] for e in entries if e["reason"] == "note happened"] == ["note"]
    assert {e["request_id"] for e in entries[1:]} == {"req-from-scheduler"}
    paged: list[dict[str, str]] = []
    cursor = None
    while True:
        params = {"limit": "1"} | ({"cursor": cursor} if cursor else {})
        page = (await api.owner.get(f"{path}/events", params=params)).body
        paged.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == entries

    running = _event(workload, "running", seq=3, state=WorkloadState.running)
    await _send(bus, running, "m3")

    async def is_running() -> bool:
        return bool((await api.owner.get(path)).body["state"] == "running")

    await eventually(is_running)


async def test_apply_event_is_idempotent_on_both_engines(api_on_store: RunningApi) -> None:
    api = api_on_store
    store = api.service.store
    assert store is not None
    workload = (await api.owner.post("/v1/workloads", {"kind": "vm", "class": "cpu-1c-2g"})).body
    event = _event(workload, "store", seq=5, state=WorkloadState.running)
    assert await apply_event(store, event) is True
    assert await apply_event(store, event) is False
    older = _event(workload, "older", seq=4, state=WorkloadState.starting)
    assert await apply_event(store, older) is True
    shown = (await api.owner.get(f"/v1/workloads/{workload['id']}")).body
    assert shown["state"] == "running"
    entries = (await api.owner.get(f"/v1/workloads/{workload['id']}/events")).body["items"]
    assert [e["state"] for e in entries] == ["pending", "starting", "running"]  # in seq order
    # An event for a workload this api does not have, or of another tenant, changes nothing.
    stranger = {"id": "w-0000000000000000000a", "tenant_id": workload["tenant_id"]}
    assert (
        await apply_event(store, _event(stranger, "x", seq=1, state=WorkloadState.running)) is False
    )
    spoofed = {"id": workload["id"], "tenant_id": "t-someone-else"}
    assert (
        await apply_event(store, _event(spoofed, "y", seq=9, state=WorkloadState.failed)) is False
    )
    assert (await api.owner.get(f"/v1/workloads/{workload['id']}")).body["state"] == "running"


async def test_a_batch_applies_as_its_events_one_after_another(api_on_store: RunningApi) -> None:
    """A fetched batch is applied in a few statements, yet ends exactly where applying its
    events one by one would: each event stored once, each workload at its newest seq."""
    api = api_on_store
    store = api.service.store
    assert store is not None
    one, two = [
        (await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})).body
        for _ in range(2)
    ]
    placed = Placement(region="local", machine="m-7", placed_class="cpu-1c-2g")
    scheduled = _event(one, "b-sched", seq=1, state=WorkloadState.scheduled, placement=placed)
    running = _event(one, "b-run", seq=3, state=WorkloadState.running)
    late = _event(one, "b-late", seq=2, state=WorkloadState.starting)
    note = _event(two, "b-note", seq=1, state=WorkloadState.pending, kind=EventKind.note)
    queued = _event(two, "b-queued", seq=2, state=WorkloadState.queued)
    stranger = {"id": "w-0000000000000000000b", "tenant_id": one["tenant_id"]}
    batch = [
        scheduled,
        running,
        scheduled,  # twice in one batch: stored once
        late,
        _event(stranger, "b-x", seq=1, state=WorkloadState.running),
        note,
        queued,
    ]
    applied = await apply_events(store, [(e, None) for e in batch])
    assert applied == [True, True, False, True, False, True, True]
    assert await apply_events(store, [(running, None), (queued, None)]) == [False, False]

    first = (await api.owner.get(f"/v1/workloads/{one['id']}")).body
    assert first["state"] == "running"  # the late seq-2 event did not move it back
    assert first["placement"]["machine"] == "m-7"  # kept from seq 1: seq 3 placed nothing
    entries = (await api.owner.get(f"/v1/workloads/{one['id']}/events")).body["items"]
    assert [e["state"] for e in entries] == ["pending", "scheduled", "starting", "running"]
    second = (await api.owner.get(f"/v1/workloads/{two['id']}")).body
    assert second["state"] == "queued"
    assert second["placement"] is None
