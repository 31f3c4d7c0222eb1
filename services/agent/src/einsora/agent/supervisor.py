"""One workload's supervisor: drives it towards its goal through a driver, and says what it sees.

Each supervisor is one asyncio task that sleeps until its goal changes or its driver wants to look
again, so a thousand running sim workloads cost no timers at all. The goal can change at any
moment (a new desired state); the supervisor finishes the step it is in, then acts on the latest
goal. Closing a supervisor (the agent stopping) leaves its process running for the next agent.

A workload that has not answered its readiness probe yet is `starting`, for at most the start
timeout, counted from when it entered `starting`. Once it has answered (it is `running`; its
handle says so, and so does its record after an agent restart), a probe that fails does not
stop it: only `probe_failures` failures in a row, spanning at least `probe_failure_window_s`,
fail it, each logged; one answer in between starts the count again. So a workload busy for a
few seconds, or an agent whose own loop stalled, kills nothing.

A workload fenced by its agent (`fence`: its machine cut off from the control plane, fence.py)
is stopped and reported failed with that reason; it is not started again until the control
plane says something new of it (a removal, or a park and then a resume). A park keeps the
fence's account: the scheduler parks what a lost machine ran, and when the machine is back its
report must still say that its agent stopped it, and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from opentelemetry.trace import Span

from einsora.agent import downloads, observability
from einsora.agent.converge import Goal
from einsora.agent.drivers import Driver, Handle, StartFailed
from einsora.agent.drivers.registry import DriverSet
from einsora.agent.observability import AgentMetrics
from einsora.agent.records import RecordStore
from einsora.common import telemetry
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import DesiredWorkload, ObservedPhase, ObservedWorkload

log = logging.getLogger("einsora.agent")

DROPPED_REASON = "not in the desired state any more: stopped, its directory kept"


PROBE_FAILURES: Final = 3
"""Failed readiness probes in a row after which a running workload is failed and stopped."""
PROBE_FAILURE_WINDOW_S: Final = 30.0
"""The least time those failures must span: a running workload is failed only after its probe
did not answer for this long. Probes after a failure are spread over it evenly."""


@dataclass(frozen=True)
class Timing:
    """How long the agent waits for workloads."""

    grace_s: float = 10.0
    """Between SIGTERM and SIGKILL when stopping."""
    start_timeout_s: float = 300.0
    """How long a workload may stay `starting` (a spec's `start_timeout_s` overrides it)."""
    probe_failures: int = PROBE_FAILURES
    """See `PROBE_FAILURES`."""
    probe_failure_window_s: float = PROBE_FAILURE_WINDOW_S
    """See `PROBE_FAILURE_WINDOW_S`."""

    def __post_init__(self) -> None:
        if self.probe_failures < 1 or self.probe_failure_window_s < 0:
            raise ValueError("probe_failures must be at least 1, the window at least 0 s")

    @property
    def probe_retry_s(self) -> float:
        """When to probe again after a running workload's probe failed."""
        return self.probe_failure_window_s / max(self.probe_failures - 1, 1)


class WorkloadSupervisor:
    """Drives one workload to its goal and reports its phase."""

    def __init__(
        self,
        workload_id: str,
        *,
        drivers: DriverSet,
        workdir: Path | None,
        records: RecordStore | None,
        on_change: Callable[[], None],
        timing: Timing,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.workload_id = workload_id
        self.drivers = drivers
        default = drivers.get(None)
        assert default is not None
        self.driver: Driver = default
        """The driver of its handle, or the one its desired entry names (the default before
        either is known)."""
        self._parked_how = ""
        """How its driver parked it last (a VM: with a managed save, or shut down)."""
        self._missing_driver: str | None = None
        """The driver its desired entry names when this agent has none of that name."""
        self.workdir = workdir
        self.records = records
        self.on_change = on_change
        self.timing = timing
        self.metrics = metrics
        self.trace: tuple[str, str | None] | None = None
        """(traceparent, request id) of its last driver action's span (tracing on)."""
        self.report_trace: tuple[str, str | None] | None = None
        """The trace the next observed report joins for this workload: set when its phase
        changes, cleared by the report (tracing on)."""
        self.goal = Goal.hold
        self.desired: DesiredWorkload | None = None
        self.phase = ObservedPhase.starting
        self.reason = ""
        self.handle: Handle | None = None
        self.dropped_at = 0
        """The generation that stopped listing this workload (see `settled_away`)."""
        self.fenced: str | None = None
        """Why its agent stopped it, cut off from the control plane (`fence`); None: it did
        not."""
        self._may_start = True
        self._starting_since = time.monotonic()
        """When it entered `starting`: the start timeout counts from here."""
        self._failed_probes = 0
        self._first_failed_at = 0.0
        self._busy = False
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        """Set while the supervisor waits for a new goal with nothing left to do."""
        self._task: asyncio.Task[None] | None = None

    # --- construction after a restart -----------------------------------------------------

    def adopt(self, handle: Handle, driver: Driver) -> None:
        """Take over a workload still running from before a restart."""
        self.driver = driver
        self.handle = handle
        self._starting_since = time.monotonic()
        self._failed_probes = 0
        self._ensure_task()

    def orphan(self, reason: str) -> None:
        """A workload the agent had started, whose process is gone: failed, not restarted."""
        self.phase = ObservedPhase.failed
        self.reason = reason
        self._may_start = False

    # --- goals ----------------------------------------------------------------------------

    def retarget(self, goal: Goal, desired: DesiredWorkload | None) -> None:
        """Set the latest goal; the supervisor acts on it as soon as its current step ends."""
        previous = self.goal
        if desired is not None:
            self.desired = desired
            if self.handle is None and not self._busy:
                self._pick_driver(desired)
        self.goal = goal
        if goal is Goal.run and previous in (Goal.park, Goal.remove, Goal.drop):
            self._may_start = True  # parked or removed, now wanted again: a fresh start
            self.fenced = None
        elif goal in (Goal.remove, Goal.drop):
            self.fenced = None
        if not self._busy:
            self._set(*self._expected_phase())
        self._idle.clear()
        self._ensure_task()
        self._wake.set()

    def fence(self, reason: str) -> bool:
        """Stop it (its machine is cut off from the control plane), and say `reason`; False
        when there is nothing to fence: its goal is not to run, it failed, or it was fenced."""
        if self.goal is not Goal.run or self.fenced is not None:
            return False
        if self.handle is None and not self._busy and not self._may_start:
            return False
        self.fenced = reason
        self._may_start = False
        self._idle.clear()
        self._ensure_task()
        self._wake.set()
        return True

    def _pick_driver(self, desired: DesiredWorkload) -> None:
        """The driver its desired entry names runs it (and deletes its files) from now on."""
        driver = self.drivers.get(desired.driver)
        if driver is None:
            self._missing_driver = desired.driver
        else:
            self.driver, self._missing_driver = driver, None

    def _expected_phase(self) -> tuple[ObservedPhase, str]:
        """The phase to report right away, before the step that gets there has run."""
        if self.goal in (Goal.run, Goal.hold):
            if self.handle is None and self.goal is Goal.run and self._may_start:
                return ObservedPhase.starting, ""
            return self.phase, self.reason
        if self.handle is not None:
            return ObservedPhase.stopping, ""
        if self.goal is Goal.park:
            return self._parked()
        if self.goal is Goal.remove and self.workdir is not None and self.workdir.exists():
            return ObservedPhase.stopping, ""
        return ObservedPhase.removed, DROPPED_REASON if self.goal is Goal.drop else ""

    async def settled(self) -> None:
        """Wait until the latest goal is reached and nothing is left to do."""
        if self.busy_or_waking:
            await self._idle.wait()

    @property
    def busy_or_waking(self) -> bool:
        """`settled()` would wait: its task runs and has not gone idle since the last goal."""
        return self._task is not None and not self._task.done() and not self._idle.is_set()

    def state(self) -> str:
        """Where it stands, in one line, for a person reading why a stop has not ended."""
        task = "none" if self._task is None else ("done" if self._task.done() else "running")
        return (
            f"{self.workload_id}: goal {self.goal.value}, phase {self.phase.value}, "
            f"driver {self.driver.name}, handle {'held' if self.handle else 'none'}, "
            f"{'busy' if self._busy else 'not busy'}, task {task}, "
            f"{'idle' if self._idle.is_set() else 'not idle'}"
        )

    @property
    def settled_away(self) -> bool:
        """Dropped, stopped and reported: the machine may forget it."""
        return (
            self.goal is Goal.drop
            and self.handle is None
            and not self._busy
            and self.phase is ObservedPhase.removed
        )

    # --- reporting ------------------------------------------------------------------------

    def observed(self) -> ObservedWorkload:
        handle = self.handle
        return ObservedWorkload(
            workload_id=self.workload_id,
            phase=self.phase,
            reason=self.reason,
            pid=None if handle is None else handle.pid,
            started_at=None if handle is None else handle.started_at,
            endpoint=None if handle is None else handle.endpoint,
            devices=None if handle is None else handle.devices,
        )

    def _set(self, phase: ObservedPhase, reason: str = "") -> None:
        token = self.desired.access_token if self.desired is not None else None
        if token and token in reason:
            reason = reason.replace(token, "REDACTED")
        if (phase, reason) != (self.phase, self.reason):
            self.phase, self.reason = phase, reason
            if telemetry.ON:
                self.report_trace = self._current_trace()
            self.on_change()

    def _current_trace(self) -> tuple[str, str | None] | None:
        if self.trace is not None:
            return self.trace
        desired = self.desired
        if desired is not None and desired.traceparent:
            return desired.traceparent, desired.request_id
        return None

    def _acted(self, action: str, span: Span | None, error: BaseException | None) -> None:
        """Count a driver action, and end its span (its context is what follows)."""
        if self.metrics is not None:
            self.metrics.action(self.driver.name, action, error is None)
        if span is not None:
            traceparent = observability.end(span, error)
            if traceparent is not None:
                request_id = self.desired.request_id if self.desired is not None else None
                self.trace = (traceparent, request_id)

    def _span(self, action: str) -> Span | None:
        if not telemetry.ON:
            return None
        return observability.driver_span(action, self.driver.name, self.desired)

    # --- the loop -------------------------------------------------------------------------

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"workload {self.workload_id}")

    def abandon(self) -> None:
        """Forget a settled workload: its task (idle, waiting for a goal) is cancelled."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        """Stop supervising (the workload's process, if any, keeps running)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()
            self._wake.clear()
            self._busy = True
            try:
                delay = await self._step()
            except Exception as exc:  # a bug must not stop the other workloads: say it, wait
                log.exception("workload supervisor failed", extra={"workload": self.workload_id})
                self._set(ObservedPhase.failed, f"the agent hit an internal error: {exc!r}")
                delay = None
            finally:
                self._busy = False
            if self._wake.is_set():
                continue
            if delay is None:
                self._idle.set()
                await self._wake.wait()
                self._idle.clear()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(delay, 0.0))

    async def _step(self) -> float | None:
        goal = self.goal
        if goal in (Goal.run, Goal.hold):
            if self.fenced is not None:
                await self._stop_fenced()
                return None
            if self.handle is None:
                if goal is not Goal.run or not self._may_start or self.desired is None:
                    return None
                await self._start(self.desired)
                if self.handle is None:
                    return None
            return await self._watch(goal)
        if self.handle is not None:
            self._set(ObservedPhase.stopping)
            if goal in (Goal.park, Goal.drop):
                self._parked_how = await self._park()
            else:
                await self._stop()
            if self.goal is not goal:
                return 0.0
        if goal is Goal.remove and self.workdir is not None and self.workdir.exists():
            self._set(ObservedPhase.stopping)
            span = self._span("delete")
            try:
                await self.driver.delete(self.workdir)
            except OSError as exc:
                self._acted("delete", span, exc)
                self._set(
                    ObservedPhase.failed, f"stopped, but its directory could not be deleted: {exc}"
                )
                return None
            self._acted("delete", span, None)
        if goal is Goal.park:
            self._set(*self._parked())
        else:
            self._set(ObservedPhase.removed, DROPPED_REASON if goal is Goal.drop else "")
        return None

    def _parked(self) -> tuple[ObservedPhase, str]:
        """Parked, or, fenced before, failed with the fence's reason."""
        if self.fenced is not None:
            return ObservedPhase.failed, self.fenced
        return ObservedPhase.parked, self._parked_how

    async def _stop_fenced(self) -> None:
        """Stop a fenced workload (if it runs), then say why it stopped."""
        if self.handle is not None:
            self._set(ObservedPhase.stopping)
            await self._stop()
            log.warning(
                "workload stopped: its machine is cut off from the control plane",
                extra={"workload": self.workload_id, "reason": self.fenced},
            )
        if self.fenced is not None:  # unless a removal came meanwhile
            self._set(ObservedPhase.failed, self.fenced)

    async def _start(self, desired: DesiredWorkload) -> None:
        self._pick_driver(desired)
        if self._missing_driver is not None:
            self._may_start = False
            self._set(ObservedPhase.failed, self.drivers.missing(self._missing_driver))
            return
        self._set(ObservedPhase.starting)
        span = self._span("start")
        try:
            # A download on the way says how far it got, as the reason it is starting.
            with downloads.reporting_to(lambda said: self._set(ObservedPhase.starting, said)):
                handle = await self.driver.start(desired, self.workdir)
        except StartFailed as exc:
            self._acted("start", span, exc)
            self._may_start = False
            self._set(ObservedPhase.failed, exc.message)
            return
        except BaseException as exc:
            self._acted("start", span, exc)
            raise
        self._acted("start", span, None)
        self.handle = handle
        self._parked_how = ""
        self._starting_since = time.monotonic()
        self._failed_probes = 0
        self._save_record(handle)
        log.info("workload started", extra={"workload": self.workload_id, "pid": handle.pid})
        self.on_change()

    def _save_record(self, handle: Handle) -> None:
        record = self.driver.record(handle)
        if record is not None and self.records is not None:
            self.records.save(self.workload_id, {**record, "driver": self.driver.name})

    async def _stop(self) -> None:
        handle = self.handle
        assert handle is not None
        span = self._span("stop")
        try:
            await self.driver.stop(handle, self.timing.grace_s)
        except BaseException as exc:
            self._acted("stop", span, exc)
            raise
        self._acted("stop", span, None)
        self._forget_handle()
        log.info("workload stopped", extra={"workload": self.workload_id, "pid": handle.pid})

    async def _park(self) -> str:
        """Park it through its driver; how it parked, in words ("" when nothing to add)."""
        handle = self.handle
        assert handle is not None
        span = self._span("park")
        try:
            how = await self.driver.park(handle, self.timing.grace_s)
        except BaseException as exc:
            self._acted("park", span, exc)
            raise
        self._acted("park", span, None)
        self._forget_handle()
        log.info(
            "workload parked", extra={"workload": self.workload_id, "pid": handle.pid, "how": how}
        )
        return how

    def _forget_handle(self) -> None:
        self.handle = None
        if self.records is not None:
            self.records.delete(self.workload_id)
        self.on_change()

    async def _watch(self, goal: Goal) -> float | None:
        handle = self.handle
        assert handle is not None
        seen = await self.driver.observe(handle)
        if seen.phase is ObservedPhase.failed:
            self._may_start = False
            self._forget_handle()
            self._set(ObservedPhase.failed, seen.reason)
            log.warning(
                "workload failed", extra={"workload": self.workload_id, "reason": self.reason}
            )
            return None
        if seen.phase is ObservedPhase.running:
            self._probe_answered(handle)
        elif handle.ready:
            verdict = self._probe_failed(seen.reason, goal)
            if verdict is not None:
                await self._stop()
                self._may_start = False
                self._set(ObservedPhase.failed, verdict)
                log.warning(
                    "workload failed", extra={"workload": self.workload_id, "reason": self.reason}
                )
                return None
            self._set(ObservedPhase.running)
            return self.timing.probe_retry_s
        elif goal is Goal.run:
            limit = self._start_timeout()
            if time.monotonic() - self._starting_since > limit:
                await self._stop()
                self._may_start = False
                last = f" (last: {seen.reason})" if seen.reason else ""
                self._set(
                    ObservedPhase.failed,
                    f"not ready after {limit:g} s: its readiness probe never answered{last}; "
                    "stopped",
                )
                return None
        self._set(seen.phase)
        return seen.recheck_s

    def _probe_answered(self, handle: Handle) -> None:
        if self._failed_probes:
            log.info(
                "readiness probe answers again",
                extra={"workload": self.workload_id, "failed_before": self._failed_probes},
            )
            self._failed_probes = 0
        if not handle.ready:
            handle.ready = True
            self._save_record(handle)  # a restarted agent must know it was running

    def _probe_failed(self, reason: str, goal: Goal) -> str | None:
        """Count a running workload's failed probe: the reason it fails for, once its probe
        failed often enough for long enough (under goal `run` only), else None."""
        now = time.monotonic()
        if self._failed_probes == 0:
            self._first_failed_at = now
        self._failed_probes += 1
        span = now - self._first_failed_at
        log.warning(
            "readiness probe failed",
            extra={
                "workload": self.workload_id,
                "attempt": self._failed_probes,
                "of": self.timing.probe_failures,
                "reason": reason,
            },
        )
        if (
            goal is not Goal.run
            or self._failed_probes < self.timing.probe_failures
            or span < self.timing.probe_failure_window_s
        ):
            return None
        return (
            f"its readiness probe failed {self._failed_probes} times in a row over "
            f"{round(span, 1):g} s (last: {reason}); stopped"
        )

    def _start_timeout(self) -> float:
        value = (self.desired.spec if self.desired else {}).get("start_timeout_s")
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        return self.timing.start_timeout_s
