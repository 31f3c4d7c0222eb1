"""Fixtures for the scheduler's tests: a real nats-server, real stores, and a `Sim` that plays
the other services on the bus (the api publishing intents, agents writing inventories and
observed states), never a mock of the scheduler itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from nats.aio.msg import Msg
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from einsora.common.bus import names, publish
from einsora.common.ids import new_id
from einsora.common.schemas import (
    DesiredState,
    DesiredWorkload,
    Endpoint,
    Gpu,
    GpuHealth,
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    Route,
    WorkloadEvent,
    WorkloadIntent,
    WorkloadKind,
    utcnow,
)
from einsora.common.settings import Settings
from einsora.common.testing import Bus, enrol
from einsora.scheduler.service import SchedulerService

T = TypeVar("T")

TENANT = "t-test"
"""The tenant of every launch Sim makes, and the owner of every machine it enrols."""

GPU_MODELS = {"l40s-48gb": ("NVIDIA L40S", 46068), "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920)}


def inventory(
    machine_id: str,
    *,
    gpus: int = 4,
    gpu_class: str = "l40s-48gb",
    cpus: int = 64,
    memory_gib: int = 512,
    region: str = "local",
    quarantined: tuple[int, ...] = (),
) -> Inventory:
    model, memory_mib = GPU_MODELS[gpu_class]
    return Inventory(
        machine_id=machine_id,
        region=region,
        hostname=machine_id,
        os="linux",
        arch="x86_64",
        cpus=cpus,
        memory_mib=memory_gib * 1024,
        gpus=[
            Gpu(
                index=i,
                uuid=f"GPU-{machine_id}-{i}",
                model=model,
                memory_mib=memory_mib,
                health=GpuHealth.quarantined if i in quarantined else GpuHealth.ok,
            )
            for i in range(gpus)
        ],
        drivers=["sim"],
    )


class Sim:
    """Plays the api (intents) and the agents (inventory, observed) against a real bus, and
    follows what the scheduler writes: desired states, events, routes."""

    def __init__(self, bus: Bus, machines: KeyValue, routes: KeyValue) -> None:
        self.bus = bus
        self.machines = machines
        self.routes_kv = routes
        self.desired: dict[str, DesiredState | None] = {}
        self.desired_writes = 0
        self.events: dict[str, list[WorkloadEvent]] = {}
        self.event_headers: dict[str, dict[str, str]] = {}
        self.routes: dict[str, Route | None] = {}
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[Any] = []
        self._watchers: list[Any] = []

    async def start(self, *, events: bool = True) -> None:
        """Follow the bus from the beginning (a restart re-reads everything); `events=False`
        leaves EVENTS alone (a test that deleted it)."""
        self.events.clear()
        self.event_headers.clear()

        async def on_event(msg: Msg) -> None:
            event = WorkloadEvent.from_bytes(msg.data)
            self.events.setdefault(event.workload_id, []).append(event)
            self.event_headers[event.event_id] = dict(msg.headers or {})
            self._changed.set()

        if events:
            self._subs.append(
                await self.bus.js.subscribe(
                    names.EVENTS_FILTER,
                    stream=names.EVENTS.name,
                    ordered_consumer=True,
                    cb=on_event,
                )
            )
        desired = await self.machines.watch("*.desired")
        routes = await self.routes_kv.watchall()
        self._tasks.append(asyncio.create_task(self._pump_desired(desired)))
        self._tasks.append(asyncio.create_task(self._pump_routes(routes)))
        self._watchers += [desired, routes]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for watcher in self._watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()
        self._tasks, self._subs, self._watchers = [], [], []

    async def _pump_desired(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            machine_id = entry.key.removesuffix(".desired")
            if entry.operation in (KV_DEL, KV_PURGE):
                self.desired[machine_id] = None
            else:
                self.desired[machine_id] = DesiredState.from_bytes(entry.value)
                self.desired_writes += 1
            self._changed.set()

    async def _pump_routes(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            if entry.operation in (KV_DEL, KV_PURGE):
                self.routes[entry.key] = None
            else:
                self.routes[entry.key] = Route.from_bytes(entry.value)
            self._changed.set()

    # --- waiting ----------------------------------------------------------------------------

    async def until(
        self, check: Callable[[], T | None], within_s: float = 10.0, what: str = ""
    ) -> T:
        """Wait for `check()` to return something truthy, re-checking on each change."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            self._changed.clear()
            result = check()
            if result:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {within_s} s waiting for {what or check}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.25))

    async def eventually(
        self, check: Callable[[], Awaitable[T | None]], within_s: float, what: str
    ) -> T:
        """Poll an async condition with a deadline (state no watcher here follows)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        never = asyncio.Event()
        while True:
            result = await check()
            if result:
                return result
            if loop.time() > deadline:
                raise AssertionError(f"timed out after {within_s} s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(never.wait(), 0.05)

    def event(self, workload_id: str, state: str) -> WorkloadEvent | None:
        for event in self.events.get(workload_id, []):
            if event.state.value == state and event.kind.value == "transition":
                return event
        return None

    async def wait_state(
        self, workload_id: str, state: str, within_s: float = 10.0
    ) -> WorkloadEvent:
        return await self.until(
            lambda: self.event(workload_id, state), within_s, f"{workload_id} {state}"
        )

    def state(self, workload_id: str) -> str | None:
        transitions = [e for e in self.events.get(workload_id, []) if e.kind.value == "transition"]
        return transitions[-1].state.value if transitions else None

    def notes(self, workload_id: str) -> list[str]:
        return [e.reason for e in self.events.get(workload_id, []) if e.kind.value == "note"]

    def placed_on(self, workload_id: str) -> list[tuple[str, DesiredWorkload]]:
        """Every machine whose desired state lists the workload, with its entry."""
        return [
            (m, w)
            for m, d in self.desired.items()
            if d is not None
            for w in d.workloads
            if w.workload_id == workload_id
        ]

    def entry(self, machine_id: str, workload_id: str) -> DesiredWorkload | None:
        d = self.desired.get(machine_id)
        if d is None:
            return None
        return next((w for w in d.workloads if w.workload_id == workload_id), None)

    def entry_if(
        self, machine_id: str, workload_id: str, check: Callable[[DesiredWorkload], bool]
    ) -> DesiredWorkload | None:
        """The machine's entry for the workload, if it has one and `check` holds for it."""
        entry = self.entry(machine_id, workload_id)
        return entry if entry is not None and check(entry) else None

    def route_gone(self, workload_id: str) -> bool:
        return workload_id in self.routes and self.routes[workload_id] is None

    # --- playing the api --------------------------------------------------------------------

    async def launch(
        self,
        class_name: str = "l40s-48gb",
        count: int = 1,
        *,
        workload_id: str | None = None,
        at: datetime | None = None,
        request_id: str | None = None,
        tenant_id: str = TENANT,
        user_id: str | None = None,
        **fields: Any,
    ) -> str:
        """`fields`: more of the intent (a `fallback` chain, `fallback_after_s`…)."""
        workload_id = workload_id or new_id("workload")
        await self.intent(
            "create",
            workload_id,
            class_name,
            count,
            at=at,
            request_id=request_id,
            tenant_id=tenant_id,
            user_id=user_id,
            **fields,
        )
        return workload_id

    async def intent(
        self,
        action: str,
        workload_id: str,
        class_name: str = "l40s-48gb",
        count: int = 1,
        *,
        at: datetime | None = None,
        request_id: str | None = None,
        intent_id: str | None = None,
        msg_id: str | None = None,
        tenant_id: str = TENANT,
        user_id: str | None = None,
        **fields: Any,
    ) -> WorkloadIntent:
        intent = WorkloadIntent.model_validate(
            {
                "intent_id": intent_id or new_id("intent"),
                "action": action,
                "workload_id": workload_id,
                "tenant_id": tenant_id,
                "user_id": user_id,
                "region": "local",
                "kind": WorkloadKind.notebook,
                "class": class_name,
                "count": count,
                "spec": {"image": "jupyter"},
                "at": at or utcnow(),
                **fields,
            }
        )
        await publish(
            self.bus.js,
            names.intent_subject("local", workload_id),
            intent,
            request_id=request_id or new_id("request"),
            msg_id=msg_id or intent.intent_id,
        )
        return intent

    # --- playing the agents -----------------------------------------------------------------

    async def join(
        self,
        machine_id: str,
        *,
        enrolled: str | None = "same",
        owner: str = TENANT,
        **kwargs: Any,
    ) -> Inventory:
        """Enrol the machine (as the api would: in the inventory's region unless `enrolled`
        names another; None: not enrolled) and write its inventory (as its agent would)."""
        inv = inventory(machine_id, **kwargs)
        if enrolled is not None:
            region = inv.region if enrolled == "same" else enrolled
            await enrol(self.bus.js, machine_id, region=region, owner_tenant_id=owner)
        await self.machines.put(names.inventory_key(machine_id), inv.to_bytes())
        return inv

    async def report(
        self,
        machine_id: str,
        phases: dict[str, str],
        *,
        generation: int | None = None,
        reasons: dict[str, str] | None = None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        """Write the machine's observed state: `phases` maps workload id → phase."""
        applied = generation
        if applied is None:
            current = self.desired.get(machine_id)
            applied = current.generation if current else 0
        observed = ObservedState(
            machine_id=machine_id,
            generation_applied=applied,
            heartbeat_at=heartbeat_at or utcnow(),
            workloads=[
                ObservedWorkload(
                    workload_id=w,
                    phase=ObservedPhase(phase),
                    reason=(reasons or {}).get(w, ""),
                    endpoint=Endpoint(host="127.0.0.1", port=18000 + i)
                    if phase == "running"
                    else None,
                )
                for i, (w, phase) in enumerate(phases.items())
            ],
        )
        await self.machines.put(names.observed_key(machine_id), observed.to_bytes())


async def new_sim(bus: Bus) -> Sim:
    machines = await bus.js.key_value(names.MACHINES.name)
    routes = await bus.js.key_value(names.ROUTES.name)
    s = Sim(bus, machines, routes)
    await s.start()
    return s


NewSim = Callable[[Bus], Awaitable[Sim]]


@pytest.fixture
def sim_on() -> NewSim:
    """Makes a started `Sim` on another bus (a test's own server); the test stops it."""
    return new_sim


@pytest_asyncio.fixture
async def sim(bus: Bus) -> AsyncIterator[Sim]:
    s = await new_sim(bus)
    yield s
    await s.stop()


StartScheduler = Callable[..., Awaitable[SchedulerService]]


@pytest_asyncio.fixture
async def start_scheduler(bus: Bus) -> AsyncIterator[StartScheduler]:
    """Start a scheduler on the test's bus with a database URL and options; stopped at the end."""
    started: list[SchedulerService] = []

    async def start(
        database_url: str, *, settings: dict[str, Any] | None = None, **options: Any
    ) -> SchedulerService:
        """`settings` overrides the scheduler's Settings. Sim's machines report the `sim`
        driver, so this cell allows sim machines unless `settings` says otherwise."""
        fields: dict[str, Any] = {
            "nats_url": bus.url,
            "database_url": database_url,
            "region": "local",
            "sim_machines": True,
            **(settings or {}),
        }
        options.setdefault("tick_s", 0.1)
        options.setdefault("audit_s", 0.3)
        service = SchedulerService(Settings(**fields), **options)
        await service.start()
        started.append(service)
        return service

    yield start
    for service in reversed(started):
        await service.stop()
