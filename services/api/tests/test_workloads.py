"""Workloads over HTTP: launch, read, list with cursors, the actions and their state rules."""

from __future__ import annotations

import sqlalchemy as sa

from einsora.api.testing import RunningApi, new_tenant

NOTEBOOK = {"kind": "notebook", "class": "cpu-1c-2g"}


async def _set_state(api: RunningApi, workload_id: str, state: str) -> None:
    """Act as the scheduler's events would, straight on the store (state rules are the api's)."""
    assert api.service.store is not None
    async with api.service.store.write() as conn:
        await conn.execute(
            sa.text("UPDATE workloads SET state = :s WHERE id = :id"),
            {"s": state, "id": workload_id},
        )


async def test_launch_answers_pending_with_a_request_id_and_a_timeline_entry(
    api: RunningApi,
) -> None:
    created = await api.owner.post(
        "/v1/workloads",
        {**NOTEBOOK, "name": "my nb", "spec": {"image": "jupyter"}},
        headers={"X-Request-ID": "my-request-1"},
    )
    assert created.status == 201
    assert created.request_id == "my-request-1"
    body = created.body
    assert body["state"] == "pending"
    assert body["class"] == "cpu-1c-2g"
    assert body["region"] == "local"
    assert body["count"] == 1
    assert body["spec"] == {"image": "jupyter"}
    assert body["fallback"] == []
    assert body["placement"] is None
    shown = await api.owner.get(f"/v1/workloads/{body['id']}")
    assert shown.status == 200
    assert shown.body == body
    events = await api.owner.get(f"/v1/workloads/{body['id']}/events")
    assert events.status == 200
    [entry] = events.body["items"]
    assert entry["kind"] == "transition"
    assert entry["state"] == "pending"
    assert entry["request_id"] == "my-request-1"
    assert "owner" in entry["reason"]


async def test_an_unsafe_request_id_is_replaced(api: RunningApi) -> None:
    answer = await api.owner.get("/v1/me", headers={"X-Request-ID": "x" * 65})
    assert answer.request_id.startswith("req-")
    answer = await api.owner.get("/v1/me", headers={"X-Request-ID": "a b\tc"})
    assert answer.request_id.startswith("req-")


async def test_idempotency_key_returns_the_first_result(api_on_store: RunningApi) -> None:
    api = api_on_store
    key = {"Idempotency-Key": "launch-42"}
    first = await api.owner.post("/v1/workloads", NOTEBOOK, headers=key)
    again = await api.owner.post("/v1/workloads", NOTEBOOK, headers=key)
    assert first.status == again.status == 201
    assert again.body["id"] == first.body["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    listed = await api.owner.get("/v1/workloads")
    assert [w["id"] for w in listed.body["items"]] == [first.body["id"]]
    other = await api.owner.post("/v1/workloads", {**NOTEBOOK, "count": 2}, headers=key)
    assert other.status == 409
    assert other.body["error"] == "idempotency_key_reused"
    bad = await api.owner.post("/v1/workloads", NOTEBOOK, headers={"Idempotency-Key": "a b"})
    assert bad.status == 422
    assert "Idempotency-Key" in bad.body["message"]


async def test_the_same_key_in_another_tenant_is_another_request(api: RunningApi) -> None:
    _, ann = await new_tenant(api, "lab", "ann")
    key = {"Idempotency-Key": "same"}
    mine = await api.owner.post("/v1/workloads", NOTEBOOK, headers=key)
    hers = await ann.post("/v1/workloads", NOTEBOOK, headers=key)
    assert hers.status == 201
    assert hers.body["id"] != mine.body["id"]


async def test_list_pages_with_cursors_and_filters(api_on_store: RunningApi) -> None:
    api = api_on_store
    ids = []
    for i in range(7):
        kind = "vm" if i % 2 else "notebook"
        created = await api.owner.post("/v1/workloads", {"kind": kind, "class": "cpu-1c-2g"})
        ids.append(created.body["id"])
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": "3"} | ({"cursor": cursor} if cursor else {})
        page = await api.owner.get("/v1/workloads", params=params)
        assert page.status == 200
        seen.extend(w["id"] for w in page.body["items"])
        pages += 1
        cursor = page.body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(ids))  # newest first
    vms = await api.owner.get("/v1/workloads", kind="vm")
    assert {w["kind"] for w in vms.body["items"]} == {"vm"}
    assert len(vms.body["items"]) == 3
    await _set_state(api, ids[0], "running")
    running = await api.owner.get("/v1/workloads", state="running")
    assert [w["id"] for w in running.body["items"]] == [ids[0]]


async def test_actions_follow_the_state_rules(api_on_store: RunningApi) -> None:
    api = api_on_store
    created = await api.owner.post("/v1/workloads", NOTEBOOK)
    wid = created.body["id"]
    # pending: no resume, and the 409 says what is allowed instead
    refused = await api.owner.post(f"/v1/workloads/{wid}/resume")
    assert refused.status == 409
    assert refused.body["error"] == "invalid_state"
    assert refused.body["message"] == (
        "cannot resume a workload that is pending: a pending workload can only be parked or removed"
    )
    # running → park → parking
    await _set_state(api, wid, "running")
    parked = await api.owner.post(f"/v1/workloads/{wid}/park")
    assert parked.status == 202
    assert parked.body["state"] == "parking"
    resumed = await api.owner.post(f"/v1/workloads/{wid}/resume")
    assert resumed.status == 409
    assert "that is parking: a parking workload can only be removed" in resumed.body["message"]
    await _set_state(api, wid, "parked")
    resumed = await api.owner.post(f"/v1/workloads/{wid}/resume")
    assert resumed.status == 202
    assert resumed.body["state"] == "pending"
    removed = await api.owner.delete(f"/v1/workloads/{wid}")
    assert removed.status == 202
    assert removed.body["state"] == "removing"
    again = await api.owner.delete(f"/v1/workloads/{wid}")
    assert again.status == 409
    states = [
        e["state"] for e in (await api.owner.get(f"/v1/workloads/{wid}/events")).body["items"]
    ]
    assert states == ["pending", "parking", "pending", "removing"]


async def test_unknown_class_is_a_422_naming_the_field(api: RunningApi) -> None:
    answer = await api.owner.post("/v1/workloads", {"kind": "vm", "class": "no-such-gpu"})
    assert answer.status == 422
    assert answer.body["details"][0]["field"] == "class"
    assert (await api.owner.get("/v1/workloads")).body["items"] == []


async def test_an_empty_fallback_is_the_same_as_none(api: RunningApi) -> None:
    # The chain's steps are checked in test_fallback.py.
    answer = await api.owner.post("/v1/workloads", {**NOTEBOOK, "fallback": []})
    assert answer.status == 201
    assert answer.body["fallback"] == []
    assert answer.body["fallback_after_s"] == 0
