from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from einsora.common.schemas import (
    DesiredState,
    DesiredWorkload,
    Endpoint,
    EventKind,
    Gpu,
    IntentAction,
    Inventory,
    Message,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    Placement,
    Resources,
    Target,
    WorkloadEvent,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
)

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

SAMPLES: list[Message] = [
    WorkloadIntent(
        intent_id="in-1",
        action=IntentAction.create,
        workload_id="w-1",
        tenant_id="t-1",
        region="local",
        kind=WorkloadKind.notebook,
        class_name="cpu-1c-2g",
        count=1,
        spec={"image": "jupyter"},
        fallback=["cpu-2c-4g"],
        at=AT,
    ),
    WorkloadEvent(
        event_id="ev-1",
        workload_id="w-1",
        tenant_id="t-1",
        kind=EventKind.transition,
        state=WorkloadState.scheduled,
        reason="placed on m-1",
        seq=3,
        at=AT,
        placement=Placement(region="local", machine="m-1", placed_class="cpu-1c-2g"),
        request_id="req-1",
    ),
    DesiredState(
        machine_id="m-1",
        generation=7,
        at=AT,
        workloads=[
            DesiredWorkload(
                workload_id="w-1",
                tenant_id="t-1",
                kind=WorkloadKind.endpoint,
                class_name="l40s-48gb",
                target=Target.running,
                spec={"command": ["serve"]},
                resources=Resources(gpus=["GPU-1"], cpus=0, memory_mib=0),
                access_token="x",
            )
        ],
    ),
    ObservedState(
        machine_id="m-1",
        generation_applied=7,
        heartbeat_at=AT,
        workloads=[
            ObservedWorkload(
                workload_id="w-1",
                phase=ObservedPhase.running,
                pid=123,
                started_at=AT,
                endpoint=Endpoint(host="127.0.0.1", port=8888),
            )
        ],
    ),
    Inventory(
        machine_id="m-1",
        region="local",
        hostname="box",
        os="linux",
        arch="x86_64",
        cpus=64,
        memory_mib=524288,
        drivers=["sim"],
        at=AT,
        gpus=[Gpu(index=0, uuid="GPU-1", model="L40S", memory_mib=46068)],
    ),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip_through_json(message: Message) -> None:
    again = type(message).from_bytes(message.to_bytes())
    assert again == message


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_a_newer_senders_unknown_fields_are_ignored(message: Message) -> None:
    raw = message.model_dump(mode="json", by_alias=True)
    raw["v"] = 2
    raw["field_from_the_future"] = {"nested": [1, 2, 3]}
    again = type(message).model_validate(raw)
    assert again.v == 2
    assert again.model_copy(update={"v": 1}) == message


def test_intent_uses_class_on_the_wire() -> None:
    raw = SAMPLES[0].model_dump(mode="json", by_alias=True)
    assert raw["class"] == "cpu-1c-2g"
    assert "class_name" not in raw


def test_missing_required_field_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError, match="workload_id"):
        WorkloadEvent.model_validate(
            {
                "event_id": "e",
                "tenant_id": "t",
                "kind": "note",
                "state": "queued",
                "reason": "r",
                "seq": 0,
            }
        )


def test_unknown_state_is_refused() -> None:
    with pytest.raises(ValidationError, match="state"):
        WorkloadEvent.model_validate(
            {
                "event_id": "e",
                "workload_id": "w",
                "tenant_id": "t",
                "kind": "note",
                "state": "exploded",
                "reason": "r",
                "seq": 0,
            }
        )
