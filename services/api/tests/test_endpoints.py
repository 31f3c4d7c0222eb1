"""Endpoint launches: the spec's check (its weights: test_model_dirs), replicas made and acted
on together, and one live endpoint per name in a tenant (the gateway's model name)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from nats.js.api import DeliverPolicy

from einsora.api.testing import RunningApi
from einsora.common.bus import names
from einsora.common.schemas import IntentAction, WorkloadIntent
from einsora.common.testing import Bus

SIM = {"kind": "endpoint", "class": "cpu-1c-2g"}


def _endpoint(name: str, **spec: Any) -> dict[str, Any]:
    return {**SIM, "name": name, "spec": {"runtime": "llamacpp", "model": "/m/x.gguf", **spec}}


async def _intents(bus: Bus, count: int) -> list[WorkloadIntent]:
    """The first `count` intents the api published (its outbox relay)."""
    sub = await bus.js.subscribe(
        names.intent_region_filter("local"),
        stream=names.INTENTS.name,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )
    try:
        return [WorkloadIntent.from_bytes((await sub.next_msg(10)).data) for _ in range(count)]
    finally:
        await sub.unsubscribe()


async def test_a_bad_endpoint_spec_is_a_422_naming_the_field(api: RunningApi) -> None:
    cases = [
        ({"runtime": "tensorrt", "model": "/m/x.gguf"}, "spec.runtime"),
        ({"runtime": "llamacpp"}, "spec.model"),
        ({"runtime": "command"}, "spec.command"),
        ({"runtime": "llamacpp", "model": "/m/x.gguf", "replicas": 0}, "spec.replicas"),
        ({"runtime": "llamacpp", "model": "/m/x.gguf", "replicas": 99}, "spec.replicas"),
        ({"runtime": "vllm", "model": "/m/pytorch_model.bin"}, "spec.model"),
        ({"runtime": "llamacpp", "model": "https://u:secret@h/w.pt?sig=s3cr3t"}, "spec.model"),
    ]
    for spec, field in cases:
        answer = await api.owner.post("/v1/workloads", {**SIM, "spec": spec})
        assert answer.status == 422, (spec, answer.body)
        assert answer.body["details"][0]["field"] == field
        assert answer.body["request_id"] == answer.request_id
        assert "secret" not in json.dumps(answer.body)
        assert "s3cr3t" not in json.dumps(answer.body)
    assert (await api.owner.get("/v1/workloads")).body["items"] == []


async def test_replicas_are_workloads_made_and_acted_on_with_their_endpoint(
    api: RunningApi, bus: Bus
) -> None:
    created = await api.owner.post("/v1/workloads", _endpoint("chat", replicas=3))
    assert created.status == 201
    first = created.body
    assert first["replica_of"] is None
    listed = (await api.owner.get("/v1/workloads?kind=endpoint")).body["items"]
    replicas = [w for w in listed if w["replica_of"] == first["id"]]
    assert len(replicas) == 2
    assert {w["name"] for w in listed} == {"chat"}
    intents = await _intents(bus, 3)
    assert sorted(i.workload_id for i in intents) == sorted(w["id"] for w in listed)
    assert {i.name for i in intents} == {"chat"}  # the scheduler routes the model by it
    # A replica acts with its endpoint, not alone.
    alone = await api.owner.post(f"/v1/workloads/{replicas[0]['id']}/park")
    assert alone.status == 409
    assert first["id"] in alone.body["message"]
    removed = await api.owner.delete(f"/v1/workloads/{first['id']}")
    assert removed.status == 202
    states = {w["id"]: w["state"] for w in (await api.owner.get("/v1/workloads")).body["items"]}
    assert set(states.values()) == {"removing"}
    removals = [i for i in await _intents(bus, 6) if i.action is IntentAction.remove]
    assert sorted(i.workload_id for i in removals) == sorted(states)


async def test_an_endpoint_name_is_taken_until_it_is_removed(api: RunningApi) -> None:
    assert (await api.owner.post("/v1/workloads", _endpoint("chat"))).status == 201
    again = await api.owner.post("/v1/workloads", _endpoint("chat"))
    assert again.status == 409
    assert again.body["error"] == "name_taken"
    # Names of notebooks are not model names.
    for _ in range(2):
        notebook = {"kind": "notebook", "class": "cpu-1c-2g", "name": "chat"}
        assert (await api.owner.post("/v1/workloads", notebook)).status == 201
    assert api.service.store is not None
    async with api.service.store.write() as conn:
        await conn.execute(sa.text("UPDATE workloads SET state = 'removed' WHERE kind='endpoint'"))
    assert (await api.owner.post("/v1/workloads", _endpoint("chat"))).status == 201


async def test_a_launch_of_replicas_past_the_tenants_cap_is_refused_whole(
    api: RunningApi,
) -> None:
    tenant = (await api.owner.get("/v1/me")).body["tenant"]["id"]
    capped = await api.owner.call("PUT", f"/v1/tenants/{tenant}/limits", {"max_workloads": 2})
    assert capped.status == 200, capped.body
    answer = await api.owner.post("/v1/workloads", _endpoint("chat", replicas=3))
    assert answer.status == 409
    assert (await api.owner.get("/v1/workloads")).body["items"] == []
