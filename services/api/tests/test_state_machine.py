"""The api's side of the one state machine: every (state, action) pair of the lifecycle table,
asked over HTTP of a workload the scheduler's events brought to that state.

An action the table allows is accepted (202, the state the table says the request records);
any other is a 409 that names the state and what is allowed from it, and changes nothing. The
scheduler's side of the same pairs is services/scheduler/tests/test_state_machine.py.
"""

from __future__ import annotations

import secrets

from einsora.api.testing import Answer, RunningApi, eventually
from einsora.common import lifecycle
from einsora.common.bus import names, publish
from einsora.common.schemas import EventKind, IntentAction, WorkloadEvent, WorkloadState
from einsora.common.testing import Bus

RUN = secrets.token_hex(4)


async def _move(bus: Bus, workload: dict[str, str], state: WorkloadState) -> None:
    """The scheduler's event that moves the workload to `state`."""
    event = WorkloadEvent(
        event_id=f"ev-{workload['id']}-{RUN}",
        workload_id=workload["id"],
        tenant_id=workload["tenant_id"],
        kind=EventKind.transition,
        state=state,
        reason=f"now {state.value}",
        seq=1,
    )
    subject = names.event_subject(event.workload_id)
    await publish(bus.js, subject, event, request_id="req-scheduler", msg_id=event.event_id)


async def _ask(api: RunningApi, action: IntentAction, workload_id: str) -> Answer:
    path = f"/v1/workloads/{workload_id}"
    if action is IntentAction.remove:
        return await api.owner.delete(path)
    return await api.owner.post(f"{path}/{action.value}")


async def test_the_api_accepts_what_the_table_allows(api: RunningApi, bus: Bus) -> None:
    pairs = [(s, a) for s in WorkloadState for a in lifecycle.ACTIONS]
    workloads: dict[tuple[WorkloadState, IntentAction], dict[str, str]] = {}
    for pair in pairs:
        created = await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
        assert created.status == 201, created.text
        workloads[pair] = created.body
        if pair[0] is not WorkloadState.pending:
            await _move(bus, created.body, pair[0])

    async def all_moved() -> bool:
        listed = await api.owner.get("/v1/workloads", params={"limit": "100"})
        states = {w["id"]: w["state"] for w in listed.body["items"]}
        return all(states[w["id"]] == s.value for (s, _), w in workloads.items())

    await eventually(all_moved)

    for (state, action), workload in workloads.items():
        answer = await _ask(api, action, workload["id"])
        shown = (await api.owner.get(f"/v1/workloads/{workload['id']}")).body["state"]
        what = f"{action.value} from {state.value}"
        if lifecycle.allows(action, state):
            assert answer.status == 202, f"{what}: {answer.text}"
            assert answer.body["state"] == shown == lifecycle.ACTIONS[action].requested.value
        else:
            assert answer.status == 409, f"{what}: {answer.text}"
            assert answer.body["error"] == "invalid_state"
            assert answer.body["message"] == lifecycle.refusal(action, state)
            assert answer.body["request_id"] == answer.request_id
            assert shown == state.value, f"a refused {what} changed the state"
