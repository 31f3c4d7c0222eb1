"""The outbox: every change's intent reaches INTENTS once, with its headers, even across an
outage of NATS during which the HTTP calls still succeed."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from einsora.api.testing import RunningApi, eventually, running_api
from einsora.common.bus import connect, names
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import IntentAction, WorkloadIntent
from einsora.common.settings import Settings
from einsora.common.testing import Bus


async def _intents(js: JetStreamContext) -> JetStreamContext.PushSubscription:
    return await js.subscribe(
        names.intent_region_filter("local"),
        stream=names.INTENTS.name,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )


async def _unsent(api: RunningApi) -> int:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        count = await conn.scalar(sa.text("SELECT count(*) FROM outbox WHERE sent_at IS NULL"))
    return int(count or 0)


async def test_each_change_publishes_its_intent_with_its_headers(api: RunningApi, bus: Bus) -> None:
    sub = await _intents(bus.js)
    created = await api.owner.post(
        "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g", "spec": {"a": 1}}
    )
    msg: Msg = await sub.next_msg(timeout=5)
    intent = WorkloadIntent.from_bytes(msg.data)
    assert msg.subject == names.intent_subject("local", created.body["id"])
    assert intent.action is IntentAction.create
    assert intent.workload_id == created.body["id"]
    assert intent.tenant_id == created.body["tenant_id"]
    assert intent.class_name == "cpu-1c-2g"
    assert intent.spec == {"a": 1}
    assert msg.headers is not None
    assert msg.headers[names.MSG_ID_HEADER] == intent.intent_id
    assert msg.headers[names.REQUEST_ID_HEADER] == created.request_id
    removed = await api.owner.delete(f"/v1/workloads/{created.body['id']}")
    msg = await sub.next_msg(timeout=5)
    intent = WorkloadIntent.from_bytes(msg.data)
    assert intent.action is IntentAction.remove
    assert msg.headers is not None
    assert msg.headers[names.REQUEST_ID_HEADER] == removed.request_id
    await eventually(lambda: _zero(api))
    await sub.unsubscribe()


async def _zero(api: RunningApi) -> bool:
    return await _unsent(api) == 0


async def test_intents_survive_a_nats_outage_and_arrive_exactly_once(
    own_nats_server: EmbeddedNats, sqlite_url: str, data_dir: Path
) -> None:
    settings = Settings(nats_url=own_nats_server.url, database_url=sqlite_url, data_dir=data_dir)
    async with running_api(settings) as api:
        before = await api.owner.post("/v1/workloads", {"kind": "vm", "class": "cpu-1c-2g"})
        await eventually(lambda: _zero(api))

        own_nats_server.stop()
        during = await api.owner.post("/v1/workloads", {"kind": "vm", "class": "cpu-2c-4g"})
        assert during.status == 201
        assert (await api.owner.get("/readyz")).status == 503
        assert await _unsent(api) == 1

        own_nats_server.start()
        await eventually(lambda: _zero(api), within_s=15)
        after = await api.owner.post("/v1/workloads", {"kind": "vm", "class": "cpu-4c-16g"})
        await eventually(lambda: _zero(api))

        nc = await connect(own_nats_server.url, name="test-reader")
        try:
            sub = await _intents(nc.jetstream())
            seen: list[str] = []
            while len(seen) < 3:
                msg = await sub.next_msg(timeout=5)
                seen.append(WorkloadIntent.from_bytes(msg.data).workload_id)
            info = await nc.jetstream().stream_info(names.INTENTS.name)
        finally:
            await nc.close()
        assert seen == [before.body["id"], during.body["id"], after.body["id"]]
        assert info.state.messages == 3  # nothing lost, nothing twice
        assert (await api.owner.get("/readyz")).status == 200
