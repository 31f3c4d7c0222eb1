"""Restart safety: a scheduler stopped, or killed with SIGKILL at any instant, and started again
loses no workload, places none twice and books no device twice."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import nats.errors
import pytest
import sqlalchemy as sa
from nats.js.api import PubAck
from nats.js.errors import NotFoundError
from sqlalchemy.engine import make_url

from einsora.common.bus import connect, message_headers, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import DesiredState, Route, WorkloadIntent, WorkloadKind
from einsora.common.settings import Settings
from einsora.common.testing import Bus, subprocess_env
from einsora.scheduler.service import SchedulerService
from einsora.store import create_engine

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import NewSim, Sim, StartScheduler


async def test_a_restarted_scheduler_carries_on_from_its_store(
    sim: Sim, start_scheduler: StartScheduler, store_url: str
) -> None:
    await sim.join("m-1", gpus=2)
    await sim.join("m-2", gpus=2)
    first = await start_scheduler(store_url)
    w1 = await sim.launch()
    w2 = await sim.launch()
    await sim.wait_state(w1, "scheduled")
    await sim.wait_state(w2, "scheduled")
    await sim.report("m-1", {w1: "running", w2: "starting"})
    await sim.wait_state(w1, "running")
    route = await sim.until(lambda: sim.routes.get(w1), what="route")
    generation = sim.desired["m-2"].generation  # type: ignore[union-attr]
    token = sim.entry("m-1", w1).access_token  # type: ignore[union-attr]
    await first.stop()

    # While it is down, a launch arrives and the agent reports progress.
    w3 = await sim.launch("l40s-48gb", 2)
    await sim.report("m-1", {w1: "running", w2: "running"})
    await start_scheduler(store_url)

    await sim.wait_state(w2, "running")
    placed = await sim.wait_state(w3, "scheduled")
    assert placed.placement is not None
    assert placed.placement.machine == "m-2"
    await sim.until(lambda: sim.entry("m-2", w3), what="w3 in desired")
    assert sim.desired["m-2"].generation == generation + 1  # type: ignore[union-attr]
    assert sim.entry("m-1", w1).access_token == token  # type: ignore[union-attr]
    assert sim.routes.get(w1) == route
    uuids = [u for d in sim.desired.values() if d for w in d.workloads for u in w.resources.gpus]
    assert len(uuids) == len(set(uuids)) == 4
    for w in (w1, w2, w3):
        seqs = [e.seq for e in sim.events[w]]
        assert seqs == list(range(1, len(seqs) + 1))


BURST = 200
MACHINES = 60  # x 4 GPUs = 240 devices for 225 asked


def _count(i: int) -> int:
    return 2 if i % 8 == 0 else 1


@pytest.mark.slow
async def test_sigkill_during_a_burst_of_launches_places_each_exactly_once(
    sim: Sim, store_url: str, tmp_path: Path
) -> None:
    for m in range(MACHINES):
        await sim.join(f"m-{m:03d}", gpus=4, owner="t-burst")
    command = [
        str(Path(sys.executable).parent / "einsora"),
        "scheduler",
        "--nats",
        sim.bus.url,
        "--region",
        "local",
        "--database-url",
        store_url,
        "--batch",
        "16",
        "--ack-wait",
        "3",
        "--log-format",
        "text",
    ]
    log_file = (tmp_path / "scheduler.log").open("ab")

    env = subprocess_env(EINSORA_SIM_MACHINES="true")  # Sim's machines report the sim driver

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, stdout=log_file, stderr=log_file, env=env)

    def scheduled() -> int:
        return sum(1 for w in sim.events if sim.event(w, "scheduled"))

    proc = spawn()
    try:
        await _until_consuming(sim)
        workloads = await _burst(sim)
        await sim.until(lambda: scheduled() >= 50, within_s=30, what="50 placements")
        proc.send_signal(signal.SIGKILL)
        proc.wait()

        proc = spawn()
        target = min(BURST, scheduled() + 30)
        await sim.until(lambda: scheduled() >= target, within_s=30, what="more placements")
        proc.send_signal(signal.SIGKILL)
        proc.wait()

        proc = spawn()
        await sim.until(lambda: scheduled() == BURST, within_s=60, what="every placement")
        await _until_settled(sim, workloads)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()

    desired = await _all_desired(sim)
    listed = Counter(w.workload_id for d in desired for w in d.workloads)
    assert set(listed) == set(workloads)
    assert all(n == 1 for n in listed.values()), "a workload is on two machines"
    uuids = [u for d in desired for w in d.workloads for u in w.resources.gpus]
    assert len(uuids) == len(set(uuids)) == sum(workloads.values()), "a device is booked twice"
    for d in desired:
        for w in d.workloads:
            assert len(w.resources.gpus) == workloads[w.workload_id]
            assert all(u.startswith(f"GPU-{d.machine_id}-") for u in w.resources.gpus)
    placements = Counter(
        e.workload_id
        for events in sim.events.values()
        for e in events
        if e.state.value == "scheduled"
    )
    assert set(placements.values()) == {1}, "a workload was placed twice"
    engine = create_engine(store_url)
    try:
        async with engine.connect() as conn:
            booked = (
                await conn.execute(sa.text("SELECT count(*) FROM scheduler_gpu_bookings"))
            ).scalar_one()
    finally:
        await engine.dispose()
    assert booked == sum(workloads.values())


async def _until_consuming(sim: Sim) -> None:
    """The scheduler is ready once its durable consumer exists."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    never = asyncio.Event()
    while True:
        with contextlib.suppress(NotFoundError):
            await sim.bus.js.consumer_info(names.INTENTS.name, "scheduler-local")
            return
        assert loop.time() < deadline, "the scheduler did not start consuming"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(never.wait(), 0.05)


async def _burst(sim: Sim) -> dict[str, int]:
    """Publish BURST create intents at once (acks awaited together)."""
    workloads: dict[str, int] = {}
    futures: list[asyncio.Future[PubAck]] = []
    for i in range(BURST):
        workload_id = new_id("workload")
        workloads[workload_id] = _count(i)
        intent = WorkloadIntent.model_validate(
            {
                "intent_id": new_id("intent"),
                "action": "create",
                "workload_id": workload_id,
                "tenant_id": "t-burst",
                "region": "local",
                "kind": WorkloadKind.notebook,
                "class": "l40s-48gb",
                "count": _count(i),
            }
        )
        futures.append(
            await sim.bus.js.publish_async(
                names.intent_subject("local", workload_id),
                intent.to_bytes(),
                headers=message_headers(request_id=new_id("request"), msg_id=intent.intent_id),
            )
        )
    await asyncio.gather(*futures)
    return workloads


async def _until_settled(sim: Sim, workloads: dict[str, int]) -> None:
    """Every workload is in some machine's desired state, as the agents would see it."""
    await sim.until(
        lambda: all(sim.placed_on(w) for w in workloads), within_s=30, what="desired states"
    )


async def _all_desired(sim: Sim) -> list[DesiredState]:
    """Every desired state in the bucket, read key by key (the stream lists the keys)."""
    kv = await sim.bus.js.key_value(names.MACHINES.name)
    info = await sim.bus.js.stream_info(
        names.MACHINES.stream, subjects_filter=names.MACHINES.key_subject(">")
    )
    found = []
    for subject in info.state.subjects or {}:
        key = subject.removeprefix(names.MACHINES.subject_prefix)
        if key.endswith(".desired"):
            entry = await kv.get(key)
            if entry.value:
                found.append(DesiredState.from_bytes(entry.value))
    return found


async def test_a_nats_restart_mid_flight_loses_nothing(
    own_nats_server: EmbeddedNats, sqlite_url: str, sim_on: NewSim
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    sim = await sim_on(Bus(nc, js, own_nats_server.url))
    service = SchedulerService(
        Settings(
            nats_url=own_nats_server.url,
            database_url=sqlite_url,
            region="local",
            sim_machines=True,  # Sim's machines report the sim driver
        ),
        tick_s=0.1,
        audit_s=0.3,
    )
    await service.start()
    try:
        await sim.join("m-1", gpus=2)
        first = await sim.launch()
        await sim.wait_state(first, "scheduled")

        own_nats_server.kill()
        own_nats_server.start()
        # The test's own ordered consumers take long to notice the restart: follow anew.
        await _retrying(sim.stop)
        await _retrying(sim.start)

        second = new_id("workload")
        await _retrying(lambda: sim.intent("create", second, intent_id=f"in-{second}"))
        await sim.wait_state(second, "scheduled", within_s=5)
        await _retrying(lambda: sim.report("m-1", {first: "running", second: "starting"}))
        await sim.wait_state(first, "running", within_s=5)
        await sim.wait_state(second, "starting", within_s=5)
        uuids = [u for w in sim.desired["m-1"].workloads for u in w.resources.gpus]  # type: ignore[union-attr]
        assert sorted(uuids) == ["GPU-m-1-0", "GPU-m-1-1"]
    finally:
        await service.stop()
        await sim.stop()
        await nc.close()


async def _retrying(call: Callable[[], Awaitable[object]], within_s: float = 20) -> None:
    """Retry a publish (with the same message id) while the server comes back."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    never = asyncio.Event()
    while True:
        try:
            await call()
            return
        except (TimeoutError, nats.errors.Error):
            assert loop.time() < deadline, "the server did not come back"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(never.wait(), 0.1)


async def test_stale_routes_are_deleted_at_start(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    first = await start_scheduler(sqlite_url)
    workload = await sim.launch()
    await sim.wait_state(workload, "scheduled")
    await first.stop()
    # As if it had crashed between recording a stop and deleting the route.
    stale = Route(
        workload_id=workload,
        tenant_id="t-test",
        kind=WorkloadKind.notebook,
        machine_id="m-1",
        host="127.0.0.1",
        port=1,
    )
    await sim.routes_kv.put(names.route_key(workload), stale.to_bytes())
    foreign = stale.model_copy(update={"workload_id": "w-of-another-region"})
    await sim.routes_kv.put(names.route_key("w-of-another-region"), foreign.to_bytes())
    await sim.until(lambda: sim.routes.get(workload), what="stale route seen")

    await start_scheduler(sqlite_url)
    await sim.until(lambda: sim.route_gone(workload), what="stale route deleted")
    assert sim.routes.get("w-of-another-region") == foreign


@pytest.mark.postgres
async def test_a_store_outage_is_ridden_out_without_losing_or_repeating_a_decision(
    sim: Sim, start_scheduler: StartScheduler, postgres_url: str
) -> None:
    await sim.join("m-1", gpus=8)
    await start_scheduler(postgres_url)
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")

    database = make_url(postgres_url).database
    admin_dsn = (
        make_url(postgres_url)
        .set(drivername="postgresql", database="postgres")
        .render_as_string(hide_password=False)
    )
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            database,
        )
        later = [await sim.launch() for _ in range(3)]
        await sim.report("m-1", {first: "running"})

        async def retried() -> bool:
            info = await sim.bus.js.consumer_info(names.INTENTS.name, "scheduler-local")
            return bool(info.num_redelivered > 0)

        await sim.eventually(retried, within_s=20, what="an intent retried")
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()

    for w in later:
        await sim.wait_state(w, "scheduled", within_s=20)
    await sim.wait_state(first, "running", within_s=20)
    for w in [first, *later]:
        assert [e.state.value for e in sim.events[w]].count("scheduled") == 1
    uuids = [u for w in sim.desired["m-1"].workloads for u in w.resources.gpus]  # type: ignore[union-attr]
    assert len(uuids) == len(set(uuids)) == 4


@pytest.mark.postgres
async def test_a_reread_that_fails_is_tried_again(
    own_nats_server: EmbeddedNats,
    postgres_url: str,
    sim_on: NewSim,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NATS restarts while the store is down: the scheduler's re-read of the machines bucket
    fails (its snapshot cannot be applied), and once the store is back it reads again and sees
    the machines that join afterwards (it once went deaf until the next reconnect)."""
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    sim = await sim_on(Bus(nc, js, own_nats_server.url))
    service = SchedulerService(
        Settings(
            nats_url=own_nats_server.url,
            database_url=postgres_url,
            region="local",
            sim_machines=True,  # Sim's machines report the sim driver
        ),
        tick_s=0.1,
        audit_s=0.3,
    )
    await service.start()
    database = make_url(postgres_url).database
    admin = await asyncpg.connect(
        make_url(postgres_url)
        .set(drivername="postgresql", database="postgres")
        .render_as_string(hide_password=False)
    )
    try:
        await sim.join("m-1", gpus=1)
        first = await sim.launch()
        await sim.wait_state(first, "scheduled")

        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            database,
        )
        reconnects = service._nc.stats["reconnects"] if service._nc else 0
        own_nats_server.kill()
        own_nats_server.start()
        await _retrying(sim.stop)
        await _retrying(sim.start)

        async def reconnected() -> bool:
            return service._nc is not None and service._nc.stats["reconnects"] > reconnects

        await sim.eventually(reconnected, within_s=20, what="the scheduler reconnected")

        async def reread_failed() -> bool:
            return any("machines bucket audit failed" in r.getMessage() for r in caplog.records)

        # Its re-read fails: the snapshot cannot reach the store (10 tries, 5 s).
        await sim.eventually(reread_failed, within_s=30, what="the re-read failed")
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')

        await _retrying(lambda: sim.join("m-2", gpus=2))
        second = await sim.launch(count=2)  # fits only on m-2
        await sim.wait_state(second, "scheduled", within_s=30)
        assert [m for m, _ in sim.placed_on(second)] == ["m-2"]
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
        await service.stop()
        await sim.stop()
        await nc.close()
