"""Anti-entropy (ADR-0011): an intent the bus lost is published again, once, with a note in the
workload's timeline; one still on the bus is left alone; streams and the timeline's consumer
deleted under a running api come back."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest_asyncio
import sqlalchemy as sa
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from einsora.api.consumers.outbox import OutboxRelay
from einsora.api.consumers.timeline import TIMELINE_CONSUMER
from einsora.api.testing import RunningApi, eventually, running_api
from einsora.common.bus import connect, identities, names, publish
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import (
    EventKind,
    IntentAction,
    WorkloadEvent,
    WorkloadIntent,
    WorkloadState,
)
from einsora.common.settings import Settings
from einsora.common.testing import Bus

PERIOD_S = 0.1
REPUBLISHED = "no longer on the bus; published again"


def _settings(nats_url: str, sqlite_url: str, data_dir: Path) -> Settings:
    return Settings(nats_url=nats_url, database_url=sqlite_url, data_dir=data_dir, region="local")


@pytest_asyncio.fixture
async def api(bus: Bus, sqlite_url: str, data_dir: Path) -> AsyncIterator[RunningApi]:
    """The api with anti-entropy on a short period (no scheduler: workloads stay waiting)."""
    settings = _settings(bus.url, sqlite_url, data_dir)
    async with running_api(settings, anti_entropy_period_s=PERIOD_S) as running:
        yield running


async def _last(js: JetStreamContext, subject: str) -> RawStreamMsg | None:
    try:
        return await js.get_last_msg(names.INTENTS.name, subject, direct=True)
    except NotFoundError:
        return None


async def _on_subject(js: JetStreamContext, subject: str) -> int:
    info = await js.stream_info(names.INTENTS.name, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def _all_sent(api: RunningApi) -> bool:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        unsent = await conn.scalar(sa.text("SELECT count(*) FROM outbox WHERE sent_at IS NULL"))
    return bool(unsent == 0)


async def _more_passes(api: RunningApi, n: int = 2) -> None:
    """Wait for `n` whole passes of anti-entropy that start after this call."""
    checker = api.service.anti_entropy
    assert checker is not None
    target = checker.passes + n + 1  # the pass in progress may have read the store before

    async def done() -> bool:
        return checker.passes >= target

    await eventually(done)


async def _notes(api: RunningApi, workload_id: str) -> list[dict[str, Any]]:
    entries = (await api.owner.get(f"/v1/workloads/{workload_id}/events")).body["items"]
    return [e for e in entries if e["kind"] == "note"]


async def _launch(api: RunningApi, bus: Bus) -> tuple[dict[str, Any], str]:
    made = await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    assert made.status == 201
    subject = names.intent_subject("local", made.body["id"])

    async def published() -> bool:
        return await _all_sent(api) and await _last(bus.js, subject) is not None

    await eventually(published)
    return made.body, subject


async def test_a_purged_intent_is_published_again_once_with_a_note(
    api: RunningApi, bus: Bus
) -> None:
    workload, subject = await _launch(api, bus)
    original = await _last(bus.js, subject)
    assert original is not None
    assert original.data is not None
    assert original.headers is not None
    sent = WorkloadIntent.from_bytes(original.data)

    await bus.js.purge_stream(names.INTENTS.name, subject=subject)

    async def back() -> bool:
        last = await _last(bus.js, subject)
        return last is not None and last.seq != original.seq

    await eventually(back)
    again = await _last(bus.js, subject)
    assert again is not None
    assert again.data is not None
    assert again.headers is not None
    republished = WorkloadIntent.from_bytes(again.data)
    # The same intent: the scheduler applies it once whether or not it saw the first copy.
    assert republished.intent_id == sent.intent_id
    assert republished.action is IntentAction.create
    assert republished.workload_id == workload["id"]
    assert again.headers[names.REQUEST_ID_HEADER] == original.headers[names.REQUEST_ID_HEADER]
    # Purged within JetStream's duplicate window: the plain id would have been dropped.
    assert again.headers[names.MSG_ID_HEADER].startswith(f"{sent.intent_id}.after.")

    notes = await _notes(api, workload["id"])
    assert [n["reason"] for n in notes] == [f"its intent to create was {REPUBLISHED}"]
    assert notes[0]["state"] == "pending"

    # Back on the bus, it is not published again by later passes.
    await _more_passes(api)
    assert await _on_subject(bus.js, subject) == 1
    assert len(await _notes(api, workload["id"])) == 1


async def test_an_intent_still_on_the_bus_is_left_alone(api: RunningApi, bus: Bus) -> None:
    workload, subject = await _launch(api, bus)
    parked = await api.owner.post(f"/v1/workloads/{workload['id']}/park")
    assert parked.status == 202
    assert parked.body["state"] == "parking"
    await eventually(lambda: _all_sent(api))
    checker = api.service.anti_entropy
    assert checker is not None
    checked = checker.checked

    await _more_passes(api)
    assert checker.checked > checked  # it was looked at, and found on the bus
    assert await _on_subject(bus.js, subject) == 2  # its create and its park, once each
    assert await _notes(api, workload["id"]) == []
    assert checker.repairs == []


async def test_only_the_intents_after_the_last_one_on_the_bus_are_published_again(
    api: RunningApi, bus: Bus
) -> None:
    workload, subject = await _launch(api, bus)
    removed = await api.owner.delete(f"/v1/workloads/{workload['id']}")
    assert removed.status == 202
    assert removed.body["state"] == "removing"

    async def both() -> bool:
        return await _all_sent(api) and await _on_subject(bus.js, subject) == 2

    await eventually(both)
    remove = await _last(bus.js, subject)
    assert remove is not None
    assert remove.seq is not None
    assert remove.data is not None
    await bus.js.delete_msg(names.INTENTS.name, remove.seq)  # the create stays

    async def repaired() -> bool:
        return len(await _notes(api, workload["id"])) == 1

    await eventually(repaired)
    assert [n["reason"] for n in await _notes(api, workload["id"])] == [
        f"its intent to remove was {REPUBLISHED}"
    ]
    last = await _last(bus.js, subject)
    assert last is not None
    assert last.data is not None
    assert WorkloadIntent.from_bytes(last.data).intent_id == (
        WorkloadIntent.from_bytes(remove.data).intent_id
    )
    assert await _on_subject(bus.js, subject) == 2  # the create was not published again


async def test_streams_and_the_timeline_consumer_deleted_under_the_api_come_back(
    own_nats_server: EmbeddedNats, sqlite_url: str, data_dir: Path
) -> None:
    settings = _settings(own_nats_server.url, sqlite_url, data_dir)
    admin = await connect(own_nats_server.url, name="admin")
    js = admin.jetstream()
    try:
        async with running_api(settings, anti_entropy_period_s=PERIOD_S) as api:
            workload, subject = await _launch(api, Bus(admin, js, own_nats_server.url))
            await js.delete_stream(names.INTENTS.name)
            await js.delete_stream(names.EVENTS.name)

            async def provisioned() -> bool:
                with contextlib.suppress(NotFoundError):
                    await js.stream_info(names.INTENTS.name)
                    await js.stream_info(names.EVENTS.name)
                    await js.consumer_info(names.EVENTS.name, TIMELINE_CONSUMER)
                    return True
                return False

            await eventually(provisioned)
            # The waiting workload's intent is on the new INTENTS, and its timeline says why.
            await eventually(lambda: _has_note(api, workload["id"]))
            again = await _last(js, subject)
            assert again is not None
            assert again.data is not None
            assert WorkloadIntent.from_bytes(again.data).workload_id == workload["id"]

            # The timeline consumes from the new EVENTS.
            event = WorkloadEvent(
                event_id=f"ev-ae-{secrets.token_hex(4)}",
                workload_id=workload["id"],
                tenant_id=workload["tenant_id"],
                kind=EventKind.transition,
                state=WorkloadState.queued,
                reason="queued by the scheduler",
                seq=0,
            )
            await publish(
                js,
                names.event_subject(workload["id"]),
                event,
                request_id="req-ae",
                msg_id=event.event_id,
            )

            async def queued() -> bool:
                shown = await api.owner.get(f"/v1/workloads/{workload['id']}")
                return bool(shown.body["state"] == "queued")

            await eventually(queued)
    finally:
        await admin.close()


async def test_the_repair_works_as_the_api_identity_on_a_locked_bus(
    tmp_path: Path, sqlite_url: str, data_dir: Path
) -> None:
    # The api as Solo runs it: its own nkey and only its permission template (ADR-0009), which
    # must allow the direct get of an intent subject's last message.
    credentials = tmp_path / "bus"
    admin_id = identities.ensure_identity(credentials, "admin")
    everything = identities.Permissions(publish=(">",), subscribe=(">",))
    users = {
        identities.API: (
            identities.ensure_identity(credentials, identities.API),
            identities.service_permissions(identities.API),
        ),
        "admin": (admin_id, everything),
    }
    server = EmbeddedNats(
        tmp_path / "nats", port=0, authorization=identities.authorization_conf(users)
    )
    server.start()
    try:
        admin = await connect(server.url, name="admin", credentials=admin_id)
        js = admin.jetstream()
        settings = _settings(server.url, sqlite_url, data_dir).model_copy(
            update={"nats_credentials_dir": credentials}
        )
        try:
            async with running_api(settings, anti_entropy_period_s=PERIOD_S) as api:
                workload, subject = await _launch(api, Bus(admin, js, server.url))
                await js.purge_stream(names.INTENTS.name, subject=subject)
                await eventually(lambda: _has_note(api, workload["id"]))
                assert await _last(js, subject) is not None
        finally:
            await admin.close()
    finally:
        server.stop()


async def test_pruning_keeps_the_intents_of_waiting_workloads(api: RunningApi, bus: Bus) -> None:
    _, waiting_subject = await _launch(api, bus)
    moved_on, _ = await _launch(api, bus)
    event = WorkloadEvent(
        event_id=f"ev-prune-{secrets.token_hex(4)}",
        workload_id=moved_on["id"],
        tenant_id=moved_on["tenant_id"],
        kind=EventKind.transition,
        state=WorkloadState.queued,
        reason="queued by the scheduler",
        seq=0,
    )
    await publish(
        bus.js, names.event_subject(moved_on["id"]), event, request_id="r", msg_id=event.event_id
    )

    async def queued() -> bool:
        shown = await api.owner.get(f"/v1/workloads/{moved_on['id']}")
        return bool(shown.body["state"] == "queued")

    await eventually(queued)
    store, nc = api.service.store, api.service.nc
    assert store is not None
    assert nc is not None
    await OutboxRelay(store, nc, bus.js, retain=timedelta(0)).prune()
    async with store.read() as conn:
        kept = set((await conn.execute(sa.text("SELECT subject FROM outbox"))).scalars())
    assert kept == {waiting_subject}  # the queued one's intent was acted on: it may go


async def _has_note(api: RunningApi, workload_id: str) -> bool:
    return any(REPUBLISHED in n["reason"] for n in await _notes(api, workload_id))


async def test_an_intent_lost_after_a_hop_is_published_again_to_the_region_that_holds_it(
    api: RunningApi, bus: Bus
) -> None:
    """ADR-0022: a region step handed the workload over; its later intents, and their repair,
    go to the region that holds it now."""
    workload, _ = await _launch(api, bus)
    hop = WorkloadEvent(
        event_id=f"{workload['id']}-1",
        workload_id=workload["id"],
        tenant_id=workload["tenant_id"],
        kind=EventKind.note,
        state=WorkloadState.pending,
        reason="cpu-1c-2g: none free in local; trying region office, whose scheduler takes it",
        seq=1,
        region="office",
    )
    await publish(bus.js, names.event_subject(workload["id"]), hop, request_id="r", msg_id="h1")

    async def heard() -> bool:
        return any("trying region office" in n["reason"] for n in await _notes(api, workload["id"]))

    await eventually(heard)
    assert (await api.owner.post(f"/v1/workloads/{workload['id']}/park")).status == 202
    office = names.intent_subject("office", workload["id"])

    async def parked_there() -> bool:
        return await _all_sent(api) and await _last(bus.js, office) is not None

    await eventually(parked_there)
    await bus.js.purge_stream(names.INTENTS.name, subject=office)

    async def back() -> bool:
        last = await _last(bus.js, office)
        return last is not None and last.data is not None

    await eventually(back)
    again = await _last(bus.js, office)
    assert again is not None
    assert again.data is not None
    republished = WorkloadIntent.from_bytes(again.data)
    assert (republished.action, republished.region) == (IntentAction.park, "office")
