"""Accounting metering the real scheduler's events: the times come from the control plane's
clock, never the agent's, and a lost machine's allocation ends at its last heartbeat.

The scheduler and accounting share one SQLite file, as in Solo; a test plays the agent by
writing its inventory and observed state to the `machines` bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest_asyncio
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from einsora.accounting.model import Allocation
from einsora.accounting.service import AccountingService
from einsora.accounting.testing import events_done
from einsora.common.bus import names, publish
from einsora.common.ids import new_id
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import (
    DesiredState,
    Endpoint,
    Gpu,
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    WorkloadIntent,
    WorkloadKind,
    utcnow,
)
from einsora.common.settings import Settings
from einsora.common.testing import Bus, enrol
from einsora.scheduler.service import SchedulerService

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting

# The scheduler turns its monotonic receive time into wall time; allow for that rounding.
SLACK = timedelta(milliseconds=50)
AGENT_SKEW = timedelta(hours=1)


class Agent:
    """One machine's agent on the bus, whose own clock is an hour behind."""

    def __init__(self, js: JetStreamContext, machines: KeyValue, machine_id: str) -> None:
        self.js = js
        self.machines = machines
        self.machine_id = machine_id
        self.phases: dict[str, ObservedPhase] = {}
        self.generation = 0
        self._beating: asyncio.Task[None] | None = None

    async def join(self) -> None:
        inventory = Inventory(
            machine_id=self.machine_id,
            region="local",
            hostname=self.machine_id,
            os="linux",
            arch="x86_64",
            cpus=32,
            memory_mib=256 * 1024,
            gpus=[
                Gpu(
                    index=i,
                    uuid=f"GPU-{self.machine_id}-{i}",
                    model="NVIDIA L40S",
                    memory_mib=46068,
                )
                for i in range(2)
            ],
            drivers=["sim"],
        )
        # Enrolled as the api would, owned by the tenant that launches (the scheduler counts
        # only enrolled machines).
        await enrol(self.js, self.machine_id, owner_tenant_id="t-sched")
        await self.machines.put(names.inventory_key(self.machine_id), inventory.to_bytes())

    async def desired(self) -> DesiredState | None:
        try:
            entry = await self.machines.get(names.desired_key(self.machine_id))
        except KeyNotFoundError:
            return None
        return DesiredState.from_bytes(entry.value) if entry.value else None

    async def wait_desired(self, workload_id: str) -> None:
        """Until the scheduler has placed the workload here."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while True:
            desired = await self.desired()
            if desired and any(w.workload_id == workload_id for w in desired.workloads):
                return
            assert loop.time() < deadline, f"{workload_id} was not placed on {self.machine_id}"
            await asyncio.sleep(0.05)

    async def report(self) -> datetime:
        """Write the observed state; the wall time just before it was written."""
        desired = await self.desired()
        self.generation = desired.generation if desired else 0
        observed = ObservedState(
            machine_id=self.machine_id,
            generation_applied=self.generation,
            heartbeat_at=utcnow() - AGENT_SKEW,
            workloads=[
                ObservedWorkload(
                    workload_id=w,
                    phase=phase,
                    endpoint=Endpoint(host="127.0.0.1", port=18000)
                    if phase is ObservedPhase.running
                    else None,
                )
                for w, phase in self.phases.items()
            ],
        )
        before = utcnow()
        await self.machines.put(names.observed_key(self.machine_id), observed.to_bytes())
        return before

    def beat(self, every_s: float = 0.1) -> None:
        async def loop() -> None:
            while True:
                raise_if_cancelled()  # a cancel its report swallowed ends it too
                await self.report()
                await asyncio.sleep(every_s)

        self._beating = asyncio.create_task(loop())

    async def fall_silent(self) -> None:
        task, self._beating = self._beating, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def launch(bus: Bus, workload_id: str, action: str = "create") -> None:
    intent = WorkloadIntent.model_validate(
        {
            "intent_id": new_id("intent"),
            "action": action,
            "workload_id": workload_id,
            "tenant_id": "t-sched",
            "region": "local",
            "kind": WorkloadKind.notebook,
            "class": "l40s-48gb",
            "count": 1,
            "spec": {"image": "jupyter"},
        }
    )
    await publish(
        bus.js,
        names.intent_subject("local", workload_id),
        intent,
        request_id=new_id("request"),
        msg_id=intent.intent_id,
    )


@pytest_asyncio.fixture
async def machines(bus: Bus) -> KeyValue:
    return await bus.js.key_value(names.MACHINES.name)


@pytest_asyncio.fixture
async def start_scheduler() -> AsyncIterator[list[SchedulerService]]:
    """Schedulers a test started, stopped at its end."""
    started: list[SchedulerService] = []
    yield started
    for service in started:
        await service.stop()


async def scheduler_on(
    bus: Bus,
    started: list[SchedulerService],
    url: str,
    data_dir: Path,
    *,
    suspect_after_s: float = 30.0,
    lost_after_s: float = 120.0,
) -> SchedulerService:
    settings = Settings(
        nats_url=bus.url,
        database_url=url,
        region="local",
        data_dir=data_dir,
        sim_machines=True,  # its machines report the sim driver
    )
    service = SchedulerService(
        settings,
        tick_s=0.05,
        audit_s=0.3,
        suspect_after_s=suspect_after_s,
        lost_after_s=lost_after_s,
    )
    await service.start()
    started.append(service)
    return service


async def allocation_of(accounting: AccountingService, workload_id: str) -> Allocation | None:
    found = await accounting.store.allocations(workload_id=workload_id)
    return found[0] if found else None


async def wait_allocation(
    accounting: AccountingService, workload_id: str, *, closed: bool
) -> Allocation:
    holder: list[Allocation] = []

    async def check() -> bool:
        found = await allocation_of(accounting, workload_id)
        if found is not None and (found.ended_at is not None) == closed:
            holder.append(found)
            return True
        return False

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not await check():
        assert loop.time() < deadline, f"no {'closed' if closed else 'open'} allocation"
        await asyncio.sleep(0.05)
    return holder[0]


async def test_an_agent_an_hour_off_changes_nothing(
    bus: Bus,
    machines: KeyValue,
    start_scheduler: list[SchedulerService],
    start_accounting: StartAccounting,
    sqlite_url: str,
    data_dir: Path,
) -> None:
    await scheduler_on(bus, start_scheduler, sqlite_url, data_dir)
    accounting = await start_accounting(sqlite_url)
    agent = Agent(bus.js, machines, "m-skew")
    await agent.join()
    w = new_id("workload")
    await launch(bus, w)
    await agent.wait_desired(w)
    agent.phases[w] = ObservedPhase.starting
    await agent.report()
    agent.phases[w] = ObservedPhase.running
    reported = await agent.report()
    opened = await wait_allocation(accounting, w, closed=False)
    seen = utcnow()
    # When the control plane received the report: the agent's clock said an hour earlier.
    assert reported - SLACK <= opened.started_at <= seen
    assert (opened.machine, opened.gpus) == ("m-skew", ["GPU-m-skew-0"])
    assert opened.tenant_id == "t-sched"

    parked_at = utcnow()
    await launch(bus, w, "park")
    closed = await wait_allocation(accounting, w, closed=True)
    assert closed.ended_at is not None
    assert parked_at - SLACK <= closed.ended_at <= utcnow()
    await events_done(bus.js)


async def test_a_lost_machine_closes_its_allocation_at_its_last_heartbeat(
    bus: Bus,
    machines: KeyValue,
    start_scheduler: list[SchedulerService],
    start_accounting: StartAccounting,
    sqlite_url: str,
    data_dir: Path,
) -> None:
    lost_after_s = 1.0
    await scheduler_on(
        bus, start_scheduler, sqlite_url, data_dir, suspect_after_s=0.4, lost_after_s=lost_after_s
    )
    accounting = await start_accounting(sqlite_url)
    agent = Agent(bus.js, machines, "m-gone")
    await agent.join()
    agent.beat()
    w = new_id("workload")
    await launch(bus, w)
    await agent.wait_desired(w)
    agent.phases[w] = ObservedPhase.running
    opened = await wait_allocation(accounting, w, closed=False)

    await agent.fall_silent()
    last = await agent.report()  # its last heartbeat
    closed = await wait_allocation(accounting, w, closed=True)
    noticed = utcnow()
    assert closed.ended_at is not None
    assert closed.started_at == opened.started_at
    # At the last heartbeat: after it was sent, and at least the lost timeout before the
    # machine could be declared lost (which is before accounting saw it closed).
    assert last - SLACK <= closed.ended_at
    assert closed.ended_at <= noticed - timedelta(seconds=lost_after_s) + SLACK
