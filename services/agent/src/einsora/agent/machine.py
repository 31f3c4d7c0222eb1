"""One machine's sync with the control plane: watch its desired state, converge, report.

The desired state is level-triggered and complete. The first read after a start (and after each
reconnect) is a direct get of the key; then the machine's pinned, filtered watch delivers every
change. A generation lower than the one applied is never acted on: it makes the machine read
the key again instead. Converging only sets each workload's goal (its supervisor does the slow
work), so it is instant, and a change arriving while workloads start or stop is simply the next
goal: changes coalesce by construction.

Each acknowledged write of its own keys is contact with the control plane (`Contact`); cut off
for longer than the fence time, the machine stops the workloads that may run elsewhere by now
(`fence`, fence.py, ADR-0029), whether or not the bus is there to tell it anything.

It never reads or writes another machine's keys, and never calls `js.key_value()` or nats-py's
`kv.watch` (DESIGN.md, "Agents are untrusted clients of the bus").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import nats.errors
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from einsora.agent import observability
from einsora.agent.converge import GOAL_OF_TARGET, Goal, plan, valid_workload_id
from einsora.agent.drivers.base import Adoption, Discovers
from einsora.agent.drivers.registry import DriverSet
from einsora.agent.fence import Contact, fence_reason, stops_when_cut_off
from einsora.agent.observability import AgentMetrics
from einsora.agent.reclaim import LocalReclaim, is_guest
from einsora.agent.records import RecordStore
from einsora.agent.supervisor import Timing, WorkloadSupervisor
from einsora.common import telemetry
from einsora.common.bus import names
from einsora.common.bus.key_subscription import subscribe_key
from einsora.common.failures import log_failure, outlived, outlives
from einsora.common.schemas import (
    DesiredState,
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
)

log = logging.getLogger("einsora.agent")

_DELETE_OPS = ("DEL", "PURGE")


class MachineAgent:
    """The agent of one machine (one process can host many sim machines)."""

    def __init__(
        self,
        machine_id: str,
        *,
        js: JetStreamContext,
        kv: KeyValue,
        drivers: DriverSet,
        inventory: Inventory,
        workloads_dir: Path | None,
        records: RecordStore | None,
        timing: Timing,
        on_change: Callable[[MachineAgent], None],
        owner_tenant_id: str | None = None,
        metrics: AgentMetrics | None = None,
        fence_after_s: float = 0.0,
    ) -> None:
        self.machine_id = machine_id
        self.owner_tenant_id = owner_tenant_id
        """Its enrolment's owner; None (no enrolment): every workload is the owner's."""
        self.preempted: set[str] = set()
        """Guests' workloads this agent parked itself, its owner having reclaimed it here."""
        self.inventory_unsent = False
        """Its inventory changed (a local reclaim) and is not yet on the bus."""
        self.js = js
        self.kv = kv
        self.drivers = drivers
        self.inventory = inventory
        self.workloads_dir = workloads_dir
        self.records = records
        self.timing = timing
        self._on_change = on_change
        self.applied: int | None = None
        self.supervisors: dict[str, WorkloadSupervisor] = {}
        self.rejected: dict[str, ObservedWorkload] = {}
        self._sub: Subscription | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self._desired_key = names.desired_key(machine_id)
        self._observed_key = names.observed_key(machine_id)
        self.metrics = metrics
        self.contact = Contact(fence_after_s)
        """Its last write the bus acknowledged: how long it has been cut off (fence.py)."""
        self.stopping = False
        """`stop_workloads` was called: no desired state read after it starts anything again."""

    # --- life -------------------------------------------------------------------------------

    async def open(self) -> None:
        """Adopt what survived a restart, publish the inventory, watch, and do the first read."""
        await self.adopt()
        await self.put_inventory()
        await self.rewatch()

    async def close(self) -> None:
        """Stop watching and supervising; workloads keep running."""
        for task in (self._watch_task, self._resync_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._unsubscribe()
        await asyncio.gather(*(s.close() for s in self.supervisors.values()))

    async def stop_workloads(self) -> None:
        """Stop every workload this machine runs (directories kept), and wait until they stopped.

        Final: a desired state read meanwhile (a re-read after a reconnect, say) would give
        them their goals back, and forget a supervisor this waits on (a CI run waited on one
        for good), so none is converged to after this.
        """
        self.stopping = True
        for sup in self.supervisors.values():
            sup.retarget(Goal.drop, None)
        await asyncio.gather(*(s.settled() for s in self.supervisors.values()))

    async def adopt(self) -> None:
        """Adopt what the records name, and what the engines say runs for this machine without
        a record (a VM by its domain, a container by its label)."""
        if self.records is None:
            return
        records = self.records.load_all()
        for driver in self.drivers:
            if isinstance(driver, Discovers):
                for workload_id, record in (await driver.discover(self.machine_id)).items():
                    if workload_id not in records and valid_workload_id(workload_id):
                        log.info(
                            "workload found by its engine, without a record",
                            extra={"machine": self.machine_id, "workload": workload_id},
                        )
                        records[workload_id] = {**record, "driver": driver.name}
        for workload_id, record in records.items():
            driver = self.drivers.of_record(record)
            if driver is None:
                adoption = Adoption(None, self.drivers.missing(str(record.get("driver"))))
            else:
                adoption = await driver.adopt(record)
            sup = self._supervisor(workload_id)
            if adoption.handle is not None:
                assert driver is not None
                sup.adopt(adoption.handle, driver)
                self.records.save(workload_id, {**record, "driver": driver.name})
                log.info(
                    "workload adopted",
                    extra={
                        "machine": self.machine_id,
                        "workload": workload_id,
                        "pid": adoption.handle.pid,
                    },
                )
            else:
                self.records.delete(workload_id)
                sup.orphan(adoption.reason)
                log.warning(
                    "workload not adopted",
                    extra={
                        "machine": self.machine_id,
                        "workload": workload_id,
                        "reason": adoption.reason,
                    },
                )

    # --- bus --------------------------------------------------------------------------------

    async def put_inventory(self) -> None:
        sent = time.monotonic()
        await self.kv.put(names.inventory_key(self.machine_id), self.inventory.to_bytes())
        self.contact.heard(at=sent)
        self.inventory_unsent = False

    async def put_observed(self) -> None:
        value = self.observed().to_bytes()
        # Timed from the send, not the ack: the bus recorded it in between, and the scheduler
        # times this machine's silence from that record, so the fence never starts later.
        sent = time.monotonic()
        if not telemetry.ON:
            try:
                await self.kv.put(self._observed_key, value)
            except BaseException:
                self._reported(ok=False)
                raise
            self._reported(ok=True)
            self.contact.heard(at=sent)
            return
        # A span per workload whose change this report carries, the write in the first's trace.
        spans, headers = observability.report_spans(self.machine_id, self.supervisors.values())
        error: BaseException | None = None
        try:
            await self.js.publish(
                names.MACHINES.key_subject(self._observed_key), value, headers=headers
            )
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._reported(ok=error is None)
            for span in spans:
                observability.end(span, error)
        self.contact.heard(at=sent)

    def _reported(self, *, ok: bool) -> None:
        if self.metrics is not None:
            self.metrics.reported(ok)

    async def rebind(self, js: JetStreamContext, kv: KeyValue) -> None:
        """Move to a new connection, the old one closed for good; `rewatch` then watches and
        reads again. The workloads and the applied generation are untouched."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        # The old subscription died with its connection: there is nothing left to unsubscribe.
        self._sub = None
        self.js = js
        self.kv = kv

    async def rewatch(self) -> None:
        """(Re)subscribe to this machine's desired key, then read it directly.

        A plain subscription, no consumer (ADR-0028). The subscription exists before the direct
        get (no change can fall between them), and its messages are handled only after that
        first, consistent read.
        """
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        await self._unsubscribe()
        sub = await subscribe_key(self.js, names.MACHINES, self._desired_key)
        self._sub = sub
        await self.resync()
        self._watch_task = asyncio.create_task(self._watch(sub), name=f"watch {self.machine_id}")

    async def resync(self) -> None:
        """A direct get of the desired key: the consistent read after a start or reconnect."""
        try:
            entry = await self.kv.get(self._desired_key)
        except KeyNotFoundError:
            if self.applied is None:
                self._on_change(self)  # report what it has (adopted workloads), generation 0
            return
        if entry.value is not None:
            self._offer(entry.value, from_watch=False)

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with outlived(nats.errors.Error):
                await sub.unsubscribe()

    async def _watch(self, sub: Subscription) -> None:
        async for msg in sub.messages:
            op = (msg.headers or {}).get("KV-Operation")
            if op in _DELETE_OPS:
                # A deleted desired state is no order to stop everything (a wiped bucket is
                # rebuilt by the scheduler): keep converging to the last one.
                log.warning(
                    "desired state deleted; keeping the last", extra={"machine": self.machine_id}
                )
                continue
            if msg.data:
                self._offer(msg.data, from_watch=True)

    def _offer(self, data: bytes, *, from_watch: bool) -> None:
        try:
            desired = DesiredState.from_bytes(data)
        except ValidationError as exc:
            log.error(
                "desired state unreadable; ignored",
                extra={"machine": self.machine_id, "error": str(exc)[:500]},
            )
            return
        if desired.machine_id != self.machine_id:
            log.error(
                "desired state names another machine; ignored",
                extra={"machine": self.machine_id, "named": desired.machine_id},
            )
            return
        if self.applied is not None and desired.generation < self.applied:
            log.warning(
                "desired generation went backwards; reading the key again",
                extra={
                    "machine": self.machine_id,
                    "generation": desired.generation,
                    "applied": self.applied,
                },
            )
            if from_watch and (self._resync_task is None or self._resync_task.done()):
                self._resync_task = asyncio.create_task(self._safe_resync())
            return
        self.converge(desired)

    async def _safe_resync(self) -> None:
        try:
            await self.resync()
        except Exception as exc:
            # The next change or reconnect reads the key again; a bug is raised, as before.
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(log, "resync failed", exc, {"machine": self.machine_id})

    # --- converging -------------------------------------------------------------------------

    def converge(self, desired: DesiredState) -> None:
        """Give every workload its goal for `desired` (instant; supervisors do the work)."""
        if self.stopping:
            log.info(
                "desired state ignored: the agent is stopping this machine's workloads",
                extra={"machine": self.machine_id, "generation": desired.generation},
            )
            return
        # A dropped workload, once stopped and reported removed, is forgotten at a newer generation.
        for wid, sup in list(self.supervisors.items()):
            if sup.settled_away and desired.generation > sup.dropped_at:
                self.supervisors.pop(wid).abandon()
        result = plan(desired, list(self.supervisors))
        for a in result.assignments:
            sup = self._supervisor(a.workload_id)
            if a.goal is Goal.drop and sup.goal is not Goal.drop:
                sup.dropped_at = desired.generation
            goal = a.goal
            if goal is Goal.run and a.workload_id in self.preempted:
                goal = Goal.park  # reclaimed here: the control plane may not know yet
            sup.retarget(goal, a.desired)
        self.rejected = {
            wid: ObservedWorkload(
                workload_id=wid,
                phase=ObservedPhase.failed,
                reason="its workload id is not valid on an agent (letters, digits, - and _ only)",
            )
            for wid in result.invalid
        }
        self.applied = desired.generation
        self._on_change(self)

    def apply_reclaim(self, reclaim: LocalReclaim | None, now: datetime) -> None:
        """The owner's reclaim on this machine (None: released): park the guests whose time
        has come, and say so in the inventory."""
        if self.stopping:
            return  # every workload is being stopped already; a release would start guests
        if reclaim is None:
            for wid in self.preempted:
                sup = self.supervisors.get(wid)
                if sup is not None and sup.goal is Goal.park and sup.desired is not None:
                    sup.retarget(GOAL_OF_TARGET[sup.desired.target], None)
            self.preempted.clear()
        else:
            for wid, sup in self.supervisors.items():
                if wid in self.preempted or sup.goal is not Goal.run:
                    continue
                if not is_guest(sup.desired, self.owner_tenant_id):
                    continue
                if reclaim.stops(sup.observed().started_at, now):
                    log.info(
                        "guest workload parked: the owner reclaimed the machine here",
                        extra={"machine": self.machine_id, "workload": wid},
                    )
                    self.preempted.add(wid)
                    sup.retarget(Goal.park, None)
        reclaimed_at = None if reclaim is None else reclaim.at
        if self.inventory.reclaimed_at != reclaimed_at:
            self.inventory = self.inventory.model_copy(update={"reclaimed_at": reclaimed_at})
            self.inventory_unsent = True

    def fence(self, now: float) -> None:
        """Cut off from the control plane for the fence time at `now` (monotonic seconds): stop
        each workload that may run elsewhere by now (fence.py). Called every tick, bus or not."""
        silent_s = self.contact.cut_off_for(now)
        if silent_s is None:
            return
        reason = fence_reason(self.contact.fence_after_s)
        for wid, sup in self.supervisors.items():
            if sup.desired is None or not stops_when_cut_off(sup.desired):
                continue
            if sup.fence(reason):
                log.warning(
                    "machine cut off from the control plane: stopping a workload that may run "
                    "elsewhere",
                    extra={
                        "machine": self.machine_id,
                        "workload": wid,
                        "silent_s": round(silent_s, 1),
                    },
                )

    def _supervisor(self, workload_id: str) -> WorkloadSupervisor:
        sup = self.supervisors.get(workload_id)
        if sup is None:
            sup = WorkloadSupervisor(
                workload_id,
                drivers=self.drivers,
                workdir=None if self.workloads_dir is None else self.workloads_dir / workload_id,
                records=self.records,
                on_change=lambda: self._on_change(self),
                timing=self.timing,
                metrics=self.metrics,
            )
            self.supervisors[workload_id] = sup
        return sup

    def observed(self) -> ObservedState:
        workloads = [s.observed() for s in self.supervisors.values()]
        workloads += self.rejected.values()
        return ObservedState(
            machine_id=self.machine_id,
            generation_applied=self.applied or 0,
            workloads=workloads,
        )
