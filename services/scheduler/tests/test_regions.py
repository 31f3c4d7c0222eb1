"""Two regions, two schedulers (real processes on a real nats-server): each consumes only its
region's intents and owns only its region's machines, a region step hands a workload over to
the next region's scheduler exactly once, an intent that arrives after the hop is passed on,
and a first scheduler killed with SIGKILL in the middle of hops leaves every workload placed
once, in one region (ADR-0022)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from einsora.common.bus import bind_bucket, message_headers, names, publish
from einsora.common.ids import new_id
from einsora.common.schemas import RegionStatus, WorkloadIntent, WorkloadKind
from einsora.common.testing import subprocess_env

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim

pytestmark = pytest.mark.slow


class Schedulers:
    """`einsora scheduler --region R` processes, each with its own log file."""

    def __init__(self, sim: Sim, tmp_path: Path) -> None:
        self.sim = sim
        self.tmp_path = tmp_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[IO[bytes]] = []

    def spawn(self, region: str, database_url: str) -> None:
        log = (self.tmp_path / f"scheduler-{region}.log").open("ab")
        self.logs.append(log)
        command = [
            str(Path(sys.executable).parent / "einsora"),
            "scheduler",
            "--nats",
            self.sim.bus.url,
            "--region",
            region,
            "--database-url",
            database_url,
            "--ack-wait",
            "3",
            "--log-format",
            "text",
        ]
        env = subprocess_env(EINSORA_SIM_MACHINES="true")  # Sim's machines report sim
        self.procs[region] = subprocess.Popen(command, stdout=log, stderr=log, env=env)

    def kill(self, region: str) -> None:
        proc = self.procs.pop(region)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    async def ready(self, *regions: str) -> None:
        """Each consumes its region's intents and has told the others it is up."""
        kv = bind_bucket(self.sim.bus.js, names.REGIONS)

        async def up() -> bool:
            for region in regions:
                try:
                    await self.sim.bus.js.consumer_info(names.INTENTS.name, f"scheduler-{region}")
                    entry = await kv.get(names.region_key(region))
                except NotFoundError:
                    return False
                status = RegionStatus.from_bytes(entry.value or b"")
                if status.state.value != "up":
                    return False
            return True

        await self.sim.eventually(up, 30, f"schedulers of {regions} ready")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def schedulers(sim: Sim, tmp_path: Path) -> Any:
    made = Schedulers(sim, tmp_path)
    yield made
    made.stop()


def _intent(region: str, action: str = "create", **fields: Any) -> WorkloadIntent:
    return WorkloadIntent.model_validate(
        {
            "intent_id": new_id("intent"),
            "action": action,
            "workload_id": fields.pop("workload_id", None) or new_id("workload"),
            "tenant_id": "t-test",
            "region": region,
            "kind": WorkloadKind.notebook,
            "class": "l40s-48gb",
            **fields,
        }
    )


async def _send(sim: Sim, intent: WorkloadIntent) -> None:
    await publish(
        sim.bus.js,
        names.intent_subject(intent.region, intent.workload_id),
        intent,
        request_id=new_id("request"),
        msg_id=intent.intent_id,
    )


def _placements(sim: Sim, workload_id: str) -> list[tuple[str, str]]:
    return [
        (e.placement.region, e.placement.machine)
        for e in sim.events.get(workload_id, [])
        if e.placement is not None and e.state.value == "scheduled"
    ]


@pytest.mark.parametrize("store", ["apart", "shared"])
async def test_a_region_step_hands_the_workload_to_the_next_regions_scheduler(
    sim: Sim, schedulers: Schedulers, tmp_path: Path, store: str
) -> None:
    await sim.join("m-here", gpus=1, region="local")
    await sim.join("m-there", gpus=2, region="office")
    local_db = f"sqlite+aiosqlite:///{tmp_path / 'local.db'}"
    office_db = local_db if store == "shared" else f"sqlite+aiosqlite:///{tmp_path / 'office.db'}"
    schedulers.spawn("local", local_db)
    schedulers.spawn("office", office_db)
    await schedulers.ready("local", "office")

    first = _intent("local")
    await _send(sim, first)
    await sim.wait_state(first.workload_id, "scheduled", within_s=20)
    assert _placements(sim, first.workload_id) == [("local", "m-here")]

    hopping = _intent("local", fallback=[{"region": "office"}])
    await _send(sim, hopping)
    placed = await sim.wait_state(hopping.workload_id, "scheduled", within_s=20)
    assert placed.placement is not None
    assert (placed.placement.region, placed.placement.placed_class) == ("office", "l40s-48gb")
    assert placed.region == "office"
    events = sim.events[hopping.workload_id]
    [note] = [e for e in events if e.kind.value == "note" and "trying region office" in e.reason]
    assert note.region == "office"
    assert note.reason == (
        "l40s-48gb: none free in local (1 of 1 in use); trying region office, whose scheduler "
        "takes it from here"
    )
    # One timeline, numbered on from one region to the next, each event once.
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    await sim.until(lambda: sim.placed_on(hopping.workload_id), what="the office's desired state")
    assert [m for m, _ in sim.placed_on(hopping.workload_id)] == ["m-there"]

    # The api had not heard of the hop: its park goes to the first region, which passes it on.
    await _send(sim, _intent("local", "park", workload_id=hopping.workload_id))
    await sim.wait_state(hopping.workload_id, "parking", within_s=20)
    await sim.until(
        lambda: sim.entry_if("m-there", hopping.workload_id, lambda w: w.target.value == "parked"),
        what="parked on the office's machine",
    )


HOPS = 24


async def test_sigkill_of_the_first_scheduler_mid_hop_places_each_workload_once(
    sim: Sim, schedulers: Schedulers, tmp_path: Path
) -> None:
    # No machine of the first region offers the class: every launch goes on to the office.
    await sim.join("m-here", gpus=0, region="local")
    for i in range(HOPS // 4):
        await sim.join(f"m-office-{i}", gpus=4, region="office")
    local_db = f"sqlite+aiosqlite:///{tmp_path / 'local.db'}"
    schedulers.spawn("local", local_db)
    schedulers.spawn("office", f"sqlite+aiosqlite:///{tmp_path / 'office.db'}")
    await schedulers.ready("local", "office")
    # The bus takes no intent for the office for a while (its stream no longer captures the
    # subject): the first scheduler decides and stores every hand-over, publishes the notes
    # that tell them, and cannot publish one hand-over. It is killed there, mid-hop.
    js = sim.bus.js
    config = (await js.stream_info(names.INTENTS.name)).config
    await js.update_stream(replace(config, subjects=[names.intent_region_filter("local")]))

    intents = [_intent("local", fallback=[{"region": "office"}]) for _ in range(HOPS)]
    futures: list[asyncio.Future[PubAck]] = []
    for intent in intents:
        futures.append(
            await js.publish_async(
                names.intent_subject("local", intent.workload_id),
                intent.to_bytes(),
                headers=message_headers(request_id=new_id("request"), msg_id=intent.intent_id),
            )
        )
    await asyncio.gather(*futures)

    def handed_over() -> int:
        return sum(
            1
            for i in intents
            for e in sim.events.get(i.workload_id, [])
            if e.region == "office" and e.kind.value == "note"
        )

    await sim.until(lambda: handed_over() == HOPS, within_s=30, what="every hand-over noted")
    schedulers.kill("local")
    assert not any(_placements(sim, i.workload_id) for i in intents)
    await js.update_stream(config)  # the subject is captured again
    schedulers.spawn("local", local_db)

    def placed() -> int:
        return sum(1 for i in intents if _placements(sim, i.workload_id))

    await sim.until(lambda: placed() == HOPS, within_s=60, what="every workload placed")
    await _until_drained(sim, "local")
    await _until_drained(sim, "office")
    for intent in intents:
        [(region, machine)] = _placements(sim, intent.workload_id)  # placed once
        assert region == "office"
        assert machine.startswith("m-office-")
        events = sim.events[intent.workload_id]
        ids = [e.event_id for e in events]
        assert len(ids) == len(set(ids)), "an event was published twice"
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.region for e in events] == ["office"] * len(events)
    # Each hand-over reached the office once.
    info = await js.stream_info(
        names.INTENTS.name, subjects_filter=names.intent_region_filter("office")
    )
    assert len(info.state.subjects or {}) == HOPS
    assert set((info.state.subjects or {}).values()) == {1}
    listed = Counter(w.workload_id for d in sim.desired.values() if d for w in d.workloads)
    assert set(listed) == {i.workload_id for i in intents}
    assert set(listed.values()) == {1}, "a workload is on two machines"
    uuids = [u for d in sim.desired.values() if d for w in d.workloads for u in w.resources.gpus]
    assert len(uuids) == len(set(uuids)) == HOPS


async def _until_drained(sim: Sim, region: str) -> None:
    async def drained() -> bool:
        with contextlib.suppress(NotFoundError):
            info = await sim.bus.js.consumer_info(names.INTENTS.name, f"scheduler-{region}")
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)
        return False

    await sim.eventually(drained, 30, f"{region}'s intents all acked")
