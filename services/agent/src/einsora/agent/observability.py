"""The agent's metrics and its part of each request's trace.

Metrics (its own registry, `/metrics` on `EINSORA_AGENT_METRICS_PORT`):
- `einsora_agent_driver_actions_total{driver,action,outcome}`: starts, stops, parks and deletes
  each driver did, by whether they succeeded;
- `einsora_agent_observed_reports_total{outcome}`: observed-state writes, and failed ones;
- `einsora_agent_workloads{phase}`: the workloads this agent supervises, by observed phase.

Traces (tracing on only): each driver action is a span in the trace of the request that put the
workload in the desired state (`DesiredWorkload.traceparent`), and each observed report that
carries a workload's change is a span in that workload's trace, the KV write's `traceparent` the
first of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, SpanKind, StatusCode
from prometheus_client import Counter, Gauge

from einsora.common import metrics, telemetry
from einsora.common.bus import names
from einsora.common.schemas import DesiredWorkload, ObservedPhase

if TYPE_CHECKING:
    from einsora.agent.supervisor import WorkloadSupervisor


class AgentMetrics:
    """The agent's counters and gauges."""

    def __init__(self, driver: str | None = None) -> None:
        self.registry = metrics.new_registry()
        self.driver_actions = Counter(
            "einsora_agent_driver_actions",
            "Driver actions (start, stop, park, delete), by driver, action and outcome",
            ["driver", "action", "outcome"],
            registry=self.registry,
        )
        self.observed_reports = Counter(
            "einsora_agent_observed_reports",
            "Observed-state writes to KV, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.workloads = Gauge(
            "einsora_agent_workloads",
            "Workloads this agent supervises, by observed phase",
            ["phase"],
            registry=self.registry,
        )
        for phase in ObservedPhase:
            self.workloads.labels(phase.value).set(0)
        self._report_ok = self.observed_reports.labels("ok")
        self._report_failed = self.observed_reports.labels("failed")
        for outcome in ("ok", "failed"):
            for action in ("start", "stop", "park", "delete") if driver else ():
                self.driver_actions.labels(driver, action, outcome)

    def action(self, driver: str, action: str, ok: bool) -> None:
        self.driver_actions.labels(driver, action, "ok" if ok else "failed").inc()

    def reported(self, ok: bool) -> None:
        # Once per observed write of every machine: the two children, looked up once.
        (self._report_ok if ok else self._report_failed).inc()

    def phases(self, phases: Iterable[ObservedPhase]) -> None:
        counts = dict.fromkeys(ObservedPhase, 0)
        for phase in phases:
            counts[phase] += 1
        for phase, count in counts.items():
            self.workloads.labels(phase.value).set(count)


_TRACER = "einsora.agent"


def driver_span(action: str, driver: str, desired: DesiredWorkload | None) -> Span:
    """The span of one driver action, in its workload's trace (call only while tracing is on)."""
    return telemetry.start_span(
        telemetry.tracer(_TRACER),
        f"agent driver {action}",
        parent=desired.traceparent if desired is not None else None,
        request_id=desired.request_id if desired is not None else None,
        attributes={
            "einsora.workload_id": desired.workload_id if desired is not None else "",
            "einsora.driver": driver,
            "einsora.action": action,
        },
    )


def end(span: Span, error: BaseException | None = None) -> str | None:
    """End a span (failed with `error`); its `traceparent`, for what follows in its trace."""
    if error is not None:
        span.set_status(StatusCode.ERROR, repr(error))
    span.end()
    return telemetry.traceparent_of(span)


def report_spans(
    machine_id: str, supervisors: Iterable[WorkloadSupervisor]
) -> tuple[list[Span], dict[str, str] | None]:
    """A span per workload whose change this observed report carries, and the report's headers
    (the first span's `traceparent`); clears each workload's pending report."""
    tracer = telemetry.tracer(_TRACER)
    spans = []
    for sup in supervisors:
        if sup.report_trace is None:
            continue
        traceparent, request_id = sup.report_trace
        sup.report_trace = None
        spans.append(
            telemetry.start_span(
                tracer,
                "agent observed report",
                parent=traceparent,
                request_id=request_id,
                kind=SpanKind.PRODUCER,
                attributes={
                    "einsora.machine_id": machine_id,
                    "einsora.workload_id": sup.workload_id,
                    "einsora.phase": sup.phase.value,
                },
            )
        )
    first = telemetry.traceparent_of(spans[0]) if spans else None
    return spans, ({names.TRACEPARENT_HEADER: first} if first else None)
