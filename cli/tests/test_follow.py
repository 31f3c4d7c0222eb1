"""The CLI's stream follower against a real api on a real nats-server: it yields the snapshot,
then each change once, across the api going away and coming back on the same address.

The test plays the scheduler: it publishes the workload's events onto EVENTS, as the scheduler
does, so it decides what happens while the api is down.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from einsora.api.service import ApiService
from einsora.api.testing import eventually, running_api
from einsora.cli.client import ApiRefused
from einsora.cli.follow import StreamEvent, follow, workload_events_path
from einsora.common.bus import names, publish
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState
from einsora.common.settings import Settings
from einsora.common.testing import Bus


def settings_for(bus: Bus, tmp_path: Path) -> Settings:
    return Settings(
        nats_url=bus.url,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'einsora.db'}",
        data_dir=tmp_path,
        region="local",
        api_stream_heartbeat_s=0.2,
    )


async def happen(bus: Bus, workload: dict[str, str], seq: int, state: WorkloadState) -> None:
    """The scheduler's event number `seq` of `workload`."""
    event = WorkloadEvent(
        event_id=f"{workload['id']}-{seq}",
        workload_id=workload["id"],
        tenant_id=workload["tenant_id"],
        kind=EventKind.transition,
        state=state,
        reason=f"now {state.value}",
        seq=seq,
    )
    subject = names.event_subject(event.workload_id)
    await publish(bus.js, subject, event, request_id="req-test", msg_id=event.event_id)


class Follower:
    """`follow()` in a thread, as a CLI command runs it, until the workload is running."""

    def __init__(self, url: str, token: str, workload_id: str) -> None:
        self.events: list[StreamEvent] = []
        self.error: BaseException | None = None
        self._args = (url, token, workload_events_path(workload_id))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in follow(*self._args, backoff_s=0.05, max_backoff_s=0.2, give_up_s=30):
                self.events.append(event)
                if event.name == "workload" and event.data["state"] == "running":
                    return
        except BaseException as exc:
            self.error = exc

    def states(self) -> list[str]:
        return [e.data["state"] for e in self.events if e.name == "workload"]

    async def has(self, count: int) -> bool:
        assert self.error is None, self.error
        return len(self.events) >= count

    async def done(self) -> None:
        await asyncio.to_thread(self._thread.join, 30)
        assert not self._thread.is_alive(), f"still following; got {self.events}"
        assert self.error is None, self.error


async def test_the_follower_resumes_after_the_api_restarts(bus: Bus, tmp_path: Path) -> None:
    settings = settings_for(bus, tmp_path)
    async with running_api(settings) as api:
        port, token = api.service.port, api.owner.token
        assert port is not None
        assert token is not None
        made = await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
        assert made.status == 201, made.text
        workload = made.body
        follower = Follower(api.url, token, workload["id"])
        await eventually(lambda: follower.has(1))
        await happen(bus, workload, 1, WorkloadState.scheduled)
        await happen(bus, workload, 2, WorkloadState.starting)
        await eventually(lambda: follower.has(3))
        await api.service.stop()  # its streams end; the follower cannot connect for a while
        # What happens while the api is away is still on the bus.
        await happen(bus, workload, 3, WorkloadState.failed)
        await happen(bus, workload, 4, WorkloadState.pending)
        again = ApiService(settings, port=port)
        await again.start()
        try:
            await happen(bus, workload, 5, WorkloadState.running)
            await follower.done()
        finally:
            await again.stop()

    names_seen = [e.name for e in follower.events]
    assert names_seen == ["snapshot"] + ["workload"] * 5, "one snapshot; a resume has none"
    assert follower.states() == ["scheduled", "starting", "failed", "pending", "running"]
    ids = [int(e.id or "") for e in follower.events]
    assert ids == sorted(set(ids))


async def test_a_stream_the_api_refuses_is_an_error_at_once(bus: Bus, tmp_path: Path) -> None:
    async with running_api(settings_for(bus, tmp_path)) as api:
        token = api.owner.token
        assert token is not None
        stream = follow(api.url, token, workload_events_path("w-nosuchworkload"), give_up_s=5)
        with pytest.raises(ApiRefused) as refused:
            await asyncio.to_thread(next, stream)
        assert refused.value.status == 404
        assert "w-nosuchworkload" in str(refused.value)
