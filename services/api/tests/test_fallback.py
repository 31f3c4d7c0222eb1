"""A launch's fallback chain over HTTP (ADR-0022): each step checked against the catalog, the
regions, the machines the caller may use and the tenant's endpoints (a 422 that names the
step), the chain sent in the intent, later intents sent to the region that holds the workload,
and `/v1/regions` with each scheduler's liveness and free capacity."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from nats.js.api import DeliverPolicy

from einsora.api.testing import RunningApi, eventually
from einsora.common.bus import bind_bucket, names, publish
from einsora.common.schemas import (
    EventKind,
    Gpu,
    Inventory,
    RegionStatus,
    SchedulerState,
    WorkloadEvent,
    WorkloadIntent,
    WorkloadState,
    utcnow,
)
from einsora.common.testing import Bus, enrol

NOTEBOOK = {"kind": "notebook", "class": "l40s-48gb"}
ENDPOINT = {"kind": "endpoint", "class": "cpu-1c-2g"}


def _endpoint(name: str, **extra: Any) -> dict[str, Any]:
    spec = {"runtime": "llamacpp", "model": "/m/x.gguf", **extra.pop("spec", {})}
    return {**ENDPOINT, "name": name, "spec": spec, **extra}


async def _intents(bus: Bus, region: str, count: int) -> list[WorkloadIntent]:
    sub = await bus.js.subscribe(
        names.intent_region_filter(region),
        stream=names.INTENTS.name,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )
    try:
        return [WorkloadIntent.from_bytes((await sub.next_msg(10)).data) for _ in range(count)]
    finally:
        await sub.unsubscribe()


async def _refused(api: RunningApi, body: dict[str, Any]) -> tuple[str, str]:
    answer = await api.owner.post("/v1/workloads", body, headers={"X-Request-ID": "fb-req"})
    assert answer.status == 422, answer.text
    assert answer.body["request_id"] == "fb-req"
    [detail] = answer.body["details"]
    return detail["field"], detail["message"]


async def _machine(api: RunningApi, bus: Bus, machine_id: str, region: str) -> None:
    """An enrolled machine of the owner's tenant with two A100s, in the api's view."""
    tenant = (await api.owner.get("/v1/me")).body["tenant"]["id"]
    await enrol(bus.js, machine_id, region=region, owner_tenant_id=tenant)
    inventory = Inventory(
        machine_id=machine_id,
        region=region,
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=16,
        memory_mib=64 * 1024,
        gpus=[
            Gpu(index=i, uuid=f"{machine_id}-{i}", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
            for i in range(2)
        ],
        drivers=["sim"],
    )
    kv = bind_bucket(bus.js, names.MACHINES)
    await kv.put(names.inventory_key(machine_id), inventory.to_bytes())

    async def seen() -> bool:
        machines = (await api.owner.get("/v1/machines")).body["items"]
        return any(m["id"] == machine_id and m["inventory"] for m in machines)

    await eventually(seen)


async def test_a_chain_is_stored_shown_and_sent_with_the_intent(api: RunningApi, bus: Bus) -> None:
    body = {
        **NOTEBOOK,
        "fallback": [{"class": "a100-80gb"}, {"class": "cpu-8c-32g"}],
        "fallback_after_s": 30,
    }
    created = await api.owner.post("/v1/workloads", body)
    assert created.status == 201, created.text
    assert created.body["fallback"] == [{"class": "a100-80gb"}, {"class": "cpu-8c-32g"}]
    assert created.body["fallback_after_s"] == 30
    shown = await api.owner.get(f"/v1/workloads/{created.body['id']}")
    assert shown.body == created.body
    [intent] = await _intents(bus, "local", 1)
    assert [s.class_name for s in intent.fallback] == ["a100-80gb", "cpu-8c-32g"]
    assert intent.fallback_after_s == 30
    assert intent.replica == 1


async def test_each_step_is_checked_and_a_bad_one_is_named(api: RunningApi, bus: Bus) -> None:
    await _machine(api, bus, "m-fb1", "office")
    cases: list[tuple[list[dict[str, Any]], str, str]] = [
        ([{"class": "a200-99gb"}], "fallback.0", "no class 'a200-99gb' in the catalog"),
        (
            [{"class": "a100-80gb"}, {"class": "a100-80gb"}],
            "fallback.1",
            "a100-80gb is the class in effect already",
        ),
        ([{"region": "mars"}], "fallback.0", "no region 'mars'; the known regions are:"),
        ([{"region": "local"}], "fallback.0", "the chain is in region local already"),
        ([{"machine": "m-nosuch"}], "fallback.0", "no machine 'm-nosuch' that you may use"),
        (
            [{"machine": "m-fb1"}],
            "fallback.0",
            "m-fb1 offers no l40s-48gb, the class in effect at this step (it offers a100-80gb",
        ),
        ([{"model": "other"}], "fallback.0", "a model step is for endpoints only"),
        ([{"replicas": 1}], "fallback.0", "a replicas step is for endpoints only"),
    ]
    for chain, field, message in cases:
        found = await _refused(api, {**NOTEBOOK, "fallback": chain})
        assert found[0] == field, (chain, found)
        assert message in found[1], (chain, found)
    # The shape of a step: exactly one of its keys, and an object.
    field, message = await _refused(
        api, {**NOTEBOOK, "fallback": [{"class": "a100-80gb", "region": "office"}]}
    )
    assert field == "fallback.0"
    assert "exactly one of class, machine, region, model or replicas" in message
    assert (await _refused(api, {**NOTEBOOK, "fallback": ["cpu-2c-4g"]}))[0] == "fallback.0"
    assert (await _refused(api, {**NOTEBOOK, "fallback_after_s": -1}))[0] == "fallback_after_s"
    assert (await api.owner.get("/v1/workloads")).body["items"] == []
    # A machine step after a class step it offers, then a region: accepted, and the machine's
    # step carries its region (its enrolment's) for the scheduler.
    ok = await api.owner.post(
        "/v1/workloads",
        {**NOTEBOOK, "fallback": [{"class": "a100-80gb"}, {"machine": "m-fb1"}]},
    )
    assert ok.status == 201, ok.text
    assert ok.body["fallback"] == [{"class": "a100-80gb"}, {"machine": "m-fb1", "region": "office"}]
    # The office is a known region now (a machine is enrolled there).
    routed = await api.owner.post("/v1/workloads", {**NOTEBOOK, "fallback": [{"region": "office"}]})
    assert routed.status == 201, routed.text


async def test_model_and_replica_steps_are_an_endpoints(api: RunningApi) -> None:
    field, message = await _refused(api, _endpoint("big", fallback=[{"model": "small"}]))
    assert field == "fallback.0"
    assert message.startswith("no endpoint named 'small' in your tenant")
    small = await api.owner.post("/v1/workloads", _endpoint("small"))
    assert small.status == 201, small.text
    big = await api.owner.post("/v1/workloads", _endpoint("big", fallback=[{"model": "small"}]))
    assert big.status == 201, big.text
    assert big.body["fallback"] == [{"model": "small"}]
    field, message = await _refused(api, _endpoint("own", fallback=[{"model": "own"}]))
    assert "is this endpoint's own name" in message
    field, message = await _refused(
        api, _endpoint("three", spec={"replicas": 3}, fallback=[{"replicas": 3}])
    )
    assert field == "fallback.0"
    assert message.startswith("accepting 3 replicas is no fallback for an endpoint of 3")
    fewer = await api.owner.post(
        "/v1/workloads", _endpoint("three", spec={"replicas": 3}, fallback=[{"replicas": 1}])
    )
    assert fewer.status == 201, fewer.text


async def test_later_intents_go_to_the_region_that_holds_the_workload(
    api: RunningApi, bus: Bus
) -> None:
    await _machine(api, bus, "m-fb2", "office")
    created = await api.owner.post(
        "/v1/workloads", {**NOTEBOOK, "fallback": [{"region": "office"}]}
    )
    workload_id = created.body["id"]
    # The local scheduler hands it over: its last event names the office.
    note = WorkloadEvent(
        event_id=f"{workload_id}-1",
        workload_id=workload_id,
        tenant_id=created.body["tenant_id"],
        kind=EventKind.note,
        state=WorkloadState.pending,
        reason="l40s-48gb: none free in local (1 of 1 in use); trying region office, whose "
        "scheduler takes it from here",
        seq=1,
        region="office",
    )
    await publish(bus.js, names.event_subject(workload_id), note, request_id="r", msg_id="e1")

    async def handed_over() -> bool:
        events = (await api.owner.get(f"/v1/workloads/{workload_id}/events")).body["items"]
        return any("trying region office" in e["reason"] for e in events)

    await eventually(handed_over)
    parked = await api.owner.post(f"/v1/workloads/{workload_id}/park")
    assert parked.status == 202, parked.text
    [park] = await _intents(bus, "office", 1)
    assert park.action.value == "park"
    assert park.region == "office"
    assert park.workload_id == workload_id


async def test_regions_list_each_schedulers_liveness_and_free_capacity(
    api: RunningApi, bus: Bus
) -> None:
    kv = bind_bucket(bus.js, names.REGIONS)
    now = utcnow()
    up = RegionStatus(region="local", at=now, period_s=5, machines=2, free={"l40s-48gb": 3})
    silent = RegionStatus(region="office", at=now - timedelta(minutes=2), period_s=5, machines=1)
    stopped = RegionStatus(
        region="home", at=now, period_s=5, state=SchedulerState.stopped, free={"cpu-1c-2g": 4}
    )
    for status in (up, silent, stopped):
        await kv.put(names.region_key(status.region), status.to_bytes())

    async def listed() -> bool:
        items = (await api.owner.get("/v1/regions")).body["items"]
        return {r["name"] for r in items} == {"home", "local", "office"}

    await eventually(listed)
    regions = {r["name"]: r for r in (await api.owner.get("/v1/regions")).body["items"]}
    assert regions["local"]["scheduler"]["state"] == "up"
    assert regions["local"]["free"] == {"l40s-48gb": 3}
    assert regions["local"]["available_machines"] == 2
    assert regions["office"]["scheduler"]["state"] == "down"
    assert regions["office"]["scheduler"]["reason"].startswith(
        "region office's scheduler is not reporting (last heard of at "
    )
    assert regions["home"]["scheduler"]["state"] == "down"
    assert "region home's scheduler is stopped" in regions["home"]["scheduler"]["reason"]
    assert regions["home"]["free"] == {}
    # A launch in a region whose scheduler is down is accepted and stays pending, saying why.
    created = await api.owner.post("/v1/workloads", {**NOTEBOOK, "region": "office"})
    assert created.status == 201, created.text
    assert created.body["state"] == "pending"
    events = (await api.owner.get(f"/v1/workloads/{created.body['id']}/events")).body["items"]
    assert [e["kind"] for e in events] == ["transition", "note"]
    assert events[1]["reason"].startswith("region office's scheduler is not reporting")
    assert events[1]["reason"].endswith(
        "it stays pending until that scheduler is back, which takes it then"
    )


async def test_the_export_carries_the_chain(api: RunningApi) -> None:
    body = {**NOTEBOOK, "fallback": [{"class": "cpu-8c-32g"}], "fallback_after_s": 5}
    created = await api.owner.post("/v1/workloads", body)
    exported = await api.owner.get(f"/v1/workloads/{created.body['id']}/export")
    assert exported.status == 200, exported.text
    workload = exported.body["workload"]
    assert (workload["fallback"], workload["fallback_after_s"]) == ([{"class": "cpu-8c-32g"}], 5)
