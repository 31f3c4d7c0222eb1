"""Event streams (SSE) against a real api, a real scheduler and a sim agent on a real nats-server.

What a client relies on: a stream starts with a snapshot, then every change once, in order; a
client that drops and comes back with `Last-Event-ID` misses nothing and sees nothing twice; a
tenant sees nothing of another's; heartbeats keep a silent stream open; a token's streams are
bounded; stopping the api ends its streams cleanly.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from nats.js.api import ConsumerConfig, DeliverPolicy

from einsora.agent.service import AgentService
from einsora.api.bootstrap import owner_tenant_id
from einsora.api.services.machines import enrol_own
from einsora.api.testing import RunningApi, eventually, new_tenant, running_api
from einsora.common.bus import names, publish
from einsora.common.ids import new_id
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState
from einsora.common.settings import Settings
from einsora.common.testing import Bus
from einsora.scheduler.service import SchedulerService

HEARTBEAT_S = 0.2
MACHINE = "m-streams"
NOTEBOOK = {"kind": "notebook", "class": "cpu-1c-2g"}


@dataclass
class Frame:
    """One SSE event as a client sees it (a comment is `comment`, an id-only frame has no
    `event`)."""

    id: str | None = None
    event: str | None = None
    data: Any = None
    comment: str | None = None


@dataclass
class Sse:
    """An open event stream, read frame by frame."""

    response: aiohttp.ClientResponse
    _lines: list[str] = field(default_factory=list)

    async def next(self, within_s: float = 20.0) -> Frame | None:
        """The next frame, or None when the server ended the stream."""
        frame = Frame()
        data: list[str] = []
        seen = False
        while True:
            try:
                raw = await asyncio.wait_for(self.response.content.readline(), within_s)
            except TimeoutError:
                raise AssertionError(f"nothing came within {within_s} s") from None
            if not raw:
                return None
            line = raw.decode().rstrip("\n")
            if line == "":
                if seen:
                    if data:
                        frame.data = json.loads("\n".join(data))
                    return frame
                continue
            seen = True
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "":
                frame.comment = value
            elif name == "id":
                frame.id = value
            elif name == "event":
                frame.event = value
            elif name == "data":
                data.append(value)

    async def next_event(self, within_s: float = 20.0) -> Frame:
        """The next frame that is an event (comments, `retry:` and id-only frames skipped),
        or an AssertionError when none comes within `within_s` (pings do not count)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            left = deadline - loop.time()
            assert left > 0, f"no event within {within_s} s"
            frame = await self.next(left)
            assert frame is not None, "the stream ended"
            if frame.event is not None:
                return frame

    def close(self) -> None:
        self.response.close()


async def open_sse(
    api: RunningApi, token: str | None, path: str, last_event_id: str | None = None
) -> aiohttp.ClientResponse:
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return await api.session.get(api.url + path, headers=headers)


async def stream(
    api: RunningApi, token: str | None, path: str, last_event_id: str | None = None
) -> Sse:
    response = await open_sse(api, token, path, last_event_id)
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return Sse(response)


@dataclass
class Plane:
    api: RunningApi
    bus: Bus


@pytest_asyncio.fixture
async def plane(bus: Bus, tmp_path: Path) -> AsyncIterator[Plane]:
    """The api (heartbeats every 0.2 s), the scheduler and a sim agent whose machine is the
    owner tenant's, sharing one SQLite file as in Solo."""
    database = f"sqlite+aiosqlite:///{tmp_path / 'einsora.db'}"
    settings = Settings(
        nats_url=bus.url,
        database_url=database,
        data_dir=tmp_path,
        region="local",
        api_stream_heartbeat_s=HEARTBEAT_S,
        sim_machines=True,  # the scheduler places on the sim agent's machine
    )
    async with running_api(settings) as api:
        store = api.service.store
        assert store is not None
        assert api.service.enrolments is not None
        owner = await owner_tenant_id(store)
        assert owner is not None
        for enrolment in await enrol_own(
            store, [MACHINE], owner_tenant_id=owner, region="local", hostname=socket.gethostname()
        ):
            await api.service.enrolments.put(enrolment)
        scheduler = SchedulerService(settings, tick_s=0.05, audit_s=0.3)
        agent = AgentService(
            settings.model_copy(update={"machine_owner_tenant": owner}),
            machine_id=MACHINE,
            driver="sim",
            sim_inventory="32 cpu, 128 GiB",
            sim_start_delay_s=0.1,
            heartbeat_s=1.0,
            poll_s=0.2,
        )
        await scheduler.start()
        await agent.start()
        try:
            yield Plane(api, bus)
        finally:
            await agent.stop()
            await scheduler.stop()


async def launch(api: RunningApi, token: str | None = None) -> str:
    made = await api.client(token or api.owner.token).post("/v1/workloads", NOTEBOOK)
    assert made.status == 201, made.text
    workload_id: str = made.body["id"]
    return workload_id


async def until_running(sse: Sse, workload_ids: set[str], seen: list[Frame]) -> None:
    """Read `sse` into `seen` until every workload in `workload_ids` is running."""
    running: set[str] = set()
    while not workload_ids <= running:
        frame = await sse.next_event()
        seen.append(frame)
        items = frame.data["workloads"] if frame.event == "snapshot" else [frame.data]
        running |= {i["workload_id"] for i in items if i["state"] == "running"}


async def events_on_the_bus(bus: Bus, after: int, tenant_id: str) -> list[tuple[int, str]]:
    """(stream sequence, workload) of every event of the tenant on EVENTS after `after`."""
    last = (await bus.js.stream_info(names.EVENTS.name)).state.last_seq
    found: list[tuple[int, str]] = []
    if last <= after:
        return found
    sub = await bus.js.subscribe(
        names.EVENTS_FILTER,
        stream=names.EVENTS.name,
        ordered_consumer=True,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1
        ),
    )
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            event = WorkloadEvent.from_bytes(msg.data)
            if event.tenant_id == tenant_id:
                found.append((msg.metadata.sequence.stream, event.workload_id))
            if msg.metadata.sequence.stream >= last:
                return found
    finally:
        await sub.unsubscribe()


async def test_a_client_that_drops_and_resumes_sees_every_event_once(plane: Plane) -> None:
    api = plane.api
    first = await stream(api, api.owner.token, "/v1/events")
    snapshot = await first.next_event()
    assert snapshot.event == "snapshot"
    assert snapshot.data["workloads"] == []
    start = int(snapshot.id or "")
    assert snapshot.data["seq"] == start

    one = await launch(api)
    change = await first.next_event()  # its first change from the scheduler
    assert change.event == "workload"
    assert change.data["workload_id"] == one
    last_id = change.id
    first.close()  # dropped mid-way; more happens while it is away
    two = await launch(api)

    second = await stream(api, api.owner.token, "/v1/events", last_event_id=last_id)
    seen: list[Frame] = []
    await until_running(second, {one, two}, seen)
    second.close()
    assert all(f.event == "workload" for f in seen), "a resume brings no snapshot"

    got = [(int(f.id or ""), f.data["workload_id"]) for f in [change, *seen]]
    ids = [seq for seq, _ in got]
    assert ids == sorted(set(ids)), "each event once, in order"
    assert all(f.data["seq"] == int(f.id or "") for f in [change, *seen])
    tenant = (await api.owner.get(f"/v1/workloads/{one}")).body["tenant_id"]
    assert got == (await events_on_the_bus(plane.bus, start, tenant))[: len(got)]
    states = [f.data["state"] for f in [change, *seen] if f.data["workload_id"] == one]
    assert states[-1] == "running"
    assert "scheduled" in states


async def test_a_fresh_stream_starts_with_the_current_state_and_misses_nothing_after(
    plane: Plane,
) -> None:
    api = plane.api
    workload = await launch(api)
    sse = await stream(api, api.owner.token, f"/v1/workloads/{workload}/events?follow=true")
    snapshot = await sse.next_event()
    assert snapshot.event == "snapshot"
    (item,) = snapshot.data["workloads"]
    assert item["workload_id"] == workload
    states = [item["state"]]
    while states[-1] != "running":
        change = await sse.next_event()
        assert change.data["workload_id"] == workload
        if change.data["kind"] == "transition":
            states.append(change.data["state"])
    sse.close()

    async def timeline_transitions() -> list[str]:
        page = await api.owner.get(f"/v1/workloads/{workload}/events")
        assert page.status == 200
        assert "items" in page.body
        return [e["state"] for e in page.body["items"] if e["kind"] == "transition"]

    async def timeline_caught_up() -> bool:
        return (await timeline_transitions())[-1] == "running"

    await eventually(timeline_caught_up)
    # The snapshot's state, then each transition after it: the timeline's own ending, with
    # none skipped and none twice.
    assert (await timeline_transitions())[-len(states) :] == states


async def test_another_tenant_sees_nothing_of_ours(plane: Plane) -> None:
    api = plane.api
    _, other = await new_tenant(api, "others", "olga")
    mine = await launch(api)
    refused = await open_sse(api, other.token, f"/v1/workloads/{mine}/events?follow=true")
    assert refused.status == 404, await refused.text()
    refused.close()
    theirs_stream = await stream(api, other.token, "/v1/events")
    snapshot = await theirs_stream.next_event()
    assert snapshot.data["workloads"] == []

    own = await stream(api, api.owner.token, f"/v1/workloads/{mine}/events?follow=true")
    await until_running(own, {mine}, [])
    own.close()
    # Their own workload (queued: our machine is not shared with them) comes after ours on
    # the bus, so once theirs arrives anything of ours would have come before it.
    theirs = await launch(api, other.token)
    change = await theirs_stream.next_event()
    assert change.data["workload_id"] == theirs
    theirs_stream.close()


async def test_heartbeats_keep_a_silent_stream_open(plane: Plane) -> None:
    api = plane.api
    workload = await launch(api)
    sse = await stream(api, api.owner.token, f"/v1/workloads/{workload}/events?follow=true")
    await until_running(sse, {workload}, [])
    pings = 0
    while pings < 5:  # five intervals of silence, each filled by a ping
        frame = await sse.next(within_s=5 * HEARTBEAT_S)
        assert frame is not None, "the stream closed during the silence"
        assert frame.event is None, f"no change was expected, got {frame}"
        pings += frame.comment == "ping"
    parked = await api.owner.post(f"/v1/workloads/{workload}/park")
    assert parked.status == 202, parked.text
    change = await sse.next_event()  # the same connection still carries changes
    assert change.data["state"] in ("parking", "parked")
    sse.close()


async def test_a_token_holds_a_bounded_number_of_streams(plane: Plane) -> None:
    api = plane.api
    _, other = await new_tenant(api, "bounded", "bea")
    opened = [await stream(api, other.token, "/v1/events") for _ in range(8)]
    for sse in opened:
        assert (await sse.next_event()).event == "snapshot"
    refused = await open_sse(api, other.token, "/v1/events")
    assert refused.status == 429
    body = await refused.json()
    assert body["details"][0]["field"] == "streams_per_token"
    assert "8 open event streams" in body["message"]
    # Another token is not held back by this one's streams.
    mine = await stream(api, api.owner.token, "/v1/events")
    mine.close()
    opened.pop().close()  # one closed: its place comes back once the api sees it gone

    async def freed() -> bool:
        again = await open_sse(api, other.token, "/v1/events")
        again.close()
        return again.status == 200

    await eventually(freed)
    for sse in opened:
        sse.close()


async def test_bad_and_stale_last_event_ids(plane: Plane) -> None:
    api = plane.api
    refused = await open_sse(api, api.owner.token, "/v1/events", last_event_id="yesterday")
    assert refused.status == 422
    assert (await refused.json())["details"][0]["field"] == "Last-Event-ID"
    # An id the stream never reached (a wiped server, another cell) brings a fresh snapshot.
    sse = await stream(api, api.owner.token, "/v1/events", last_event_id="999999999")
    assert (await sse.next_event()).event == "snapshot"
    sse.close()
    # HEAD answers what GET would, without holding a stream open.
    head = await api.owner.call("HEAD", "/v1/events")
    assert head.status == 200
    assert head.headers["Content-Type"].startswith("text/event-stream")
    gone = await api.owner.call("HEAD", "/v1/workloads/w-nosuchworkload/events?follow=true")
    assert gone.status == 404


async def test_stopping_the_api_ends_its_streams_cleanly(bus: Bus, tmp_path: Path) -> None:
    settings = Settings(
        nats_url=bus.url,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'einsora.db'}",
        data_dir=tmp_path,
        region="local",
        api_stream_heartbeat_s=HEARTBEAT_S,
    )
    async with running_api(settings) as api:
        sse = await stream(api, api.owner.token, "/v1/events")
        assert (await sse.next_event()).event == "snapshot"
        await api.service.stop()
        # The stream's last chunk came: the body ends without a transfer error.
        while await sse.next(within_s=10) is not None:
            pass
        sse.close()


async def test_a_snapshot_behind_the_bus_is_followed_by_what_it_missed(plane: Plane) -> None:
    api = plane.api
    timeline = api.service._timeline  # paused, as a timeline that lags the bus would be
    assert timeline is not None
    await timeline.stop()
    try:
        workload = await launch(api)
        tenant = (await api.owner.get(f"/v1/workloads/{workload}")).body["tenant_id"]

        async def on_the_bus() -> bool:
            return len(await events_on_the_bus(plane.bus, 0, tenant)) >= 3

        await eventually(on_the_bus)
        sse = await stream(api, api.owner.token, f"/v1/workloads/{workload}/events?follow=true")
        snapshot = await sse.next_event()
        assert [w["state"] for w in snapshot.data["workloads"]] == ["pending"]  # the store's
        await until_running(sse, {workload}, [])  # the rest comes from the bus
        sse.close()
    finally:
        await timeline.start()


@pytest.mark.long
async def test_a_stream_stays_open_across_a_minute_of_silence(bus: Bus, tmp_path: Path) -> None:
    """The default heartbeat (15 s), in real time: what a proxy with a 60 s idle timeout sees."""
    settings = Settings(
        nats_url=bus.url, database_url=f"sqlite+aiosqlite:///{tmp_path / 'e.db'}", data_dir=tmp_path
    )
    assert settings.api_stream_heartbeat_s == 15
    async with running_api(settings) as api:
        sse = await stream(api, api.owner.token, "/v1/events")
        assert (await sse.next_event()).event == "snapshot"
        loop = asyncio.get_running_loop()
        quiet_until = loop.time() + 61
        pings = 0
        while loop.time() < quiet_until:
            frame = await sse.next(within_s=20)  # never more than a heartbeat and a bit
            assert frame is not None, "the stream closed during the silence"
            assert frame.event is None, f"no change was expected, got {frame}"
            pings += frame.comment == "ping"
        assert pings >= 4
        # Still the same connection: a change the scheduler publishes now arrives on it.
        assert api.service.store is not None
        tenant = await owner_tenant_id(api.service.store)
        assert tenant is not None
        change = WorkloadEvent(
            event_id=new_id("event"),
            workload_id="w-after-the-silence",
            tenant_id=tenant,
            kind=EventKind.transition,
            state=WorkloadState.queued,
            reason="waiting",
            seq=1,
        )
        await publish(
            bus.js,
            names.event_subject(change.workload_id),
            change,
            request_id=new_id("request"),
            msg_id=change.event_id,
        )
        arrived = await sse.next_event()
        assert arrived.data["workload_id"] == "w-after-the-silence"
        sse.close()
