"""What a chaos run records, as plain data: the checks read only these.

The bus's own record: every desired value and observed report the `machines` bucket stored (a
mirror stream keeps them all, in the bucket's own sequence), every leader heartbeat, every
workload event. Beside it: what the clients asked and what they were told, the faults injected
and when, accounting's allocations and usage report, and the api's view at the end. Times are
wall-clock seconds (epoch) of this host: the bus's timestamps, the events' `at` and the
harness's clock all come from it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class Row:
    """One workload in a desired value: what the machine should make of it, with its GPUs."""

    workload: str
    target: str
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class DesiredValue:
    """One value written to `<machine>.desired` (or its deletion: `deleted`)."""

    seq: int
    """Its sequence in the `machines` bucket's stream: the order the bus stored it in."""
    at: float
    machine: str
    generation: int
    rows: tuple[Row, ...] = ()
    deleted: bool = False

    @property
    def running(self) -> frozenset[str]:
        return frozenset(r.workload for r in self.rows if r.target == "running")

    def same_rows(self, other: DesiredValue) -> bool:
        return sorted(self.rows, key=_row_key) == sorted(other.rows, key=_row_key)

    def __str__(self) -> str:
        return f"{self.machine} generation {self.generation} (seq {self.seq}, {clock(self.at)})"


def _row_key(row: Row) -> tuple[str, str, tuple[str, ...]]:
    return (row.workload, row.target, row.gpus)


@dataclass(frozen=True)
class Report:
    """An observed state a machine's agent put: the bus's record of its heartbeat."""

    seq: int
    at: float
    machine: str


@dataclass(frozen=True)
class LeaderBeat:
    """A `_leader.<region>.heartbeat` value: who led, in which term, when."""

    seq: int
    at: float
    region: str
    holder: str
    term: int
    released: bool = False


@dataclass(frozen=True)
class Event:
    """One workload event on EVENTS."""

    stream_seq: int
    published: float
    """When EVENTS stored it."""
    event_id: str
    workload: str
    seq: int
    """The scheduler's own order of the workload's events."""
    transition: bool
    state: str
    reason: str
    at: float
    """The event's own time (the control plane's clock)."""
    machine: str | None = None
    """Where it is placed, as the event says (its placement, or what it meters)."""
    gpus: int = 0
    cpus: float = 0.0
    metered: bool = False


class Action(StrEnum):
    """What a client asked of a workload."""

    create = "create"
    park = "park"
    resume = "resume"
    remove = "remove"


@dataclass
class Request:
    """One HTTP request a client made, and what it was told."""

    client: int
    action: Action
    workload: str | None
    sent: float
    status: int | None = None
    """The answer's status; None: no answer (the connection failed, or it timed out)."""
    answered: float | None = None
    key: str | None = None
    """Its Idempotency-Key (launches only)."""
    replayed: bool = False
    """The api answered with the first result for this key (`Idempotent-Replayed`)."""

    @property
    def acknowledged(self) -> bool:
        return self.status in (201, 202)

    @property
    def unanswered(self) -> bool:
        return self.status is None

    @property
    def uncertain(self) -> bool:
        """It may have been carried out all the same: no answer, or a server error."""
        return self.status is None or self.status >= 500


@dataclass(frozen=True)
class Allocation:
    """A stretch of metered time: from the events (the truth), or accounting's row."""

    workload: str
    opened_by: str
    started_at: float
    gpus: int
    cpus: float
    closed_by: str | None = None
    ended_at: float | None = None


@dataclass(frozen=True)
class Usage:
    """Accounting's usage report for one workload."""

    gpu_hours: float
    cpu_core_hours: float


@dataclass(frozen=True)
class ApiView:
    """The api's answer for one workload at the end."""

    state: str
    machine: str | None


class FaultKind(StrEnum):
    """The faults a run injects (`faults.py` says what each does)."""

    api_kill = "api SIGKILL"
    api_stop = "api SIGSTOP"
    leader_kill = "leader SIGKILL"
    leader_stop = "leader SIGSTOP past its lease"
    standby_kill = "standby SIGKILL"
    standby_stop = "standby SIGSTOP"
    accounting_kill = "accounting SIGKILL"
    accounting_stop = "accounting SIGSTOP"
    nats_kill = "NATS node SIGKILL"
    sim_agent_kill = "sim agent SIGKILL"
    joined_agent_kill = "joined agent SIGKILL"
    agent_partition = "agent partitioned past lost_after"


LEADER_LOSSES = frozenset({FaultKind.leader_kill, FaultKind.leader_stop})


@dataclass
class Fault:
    """One fault injected: what, on which process, when, and when it was healed."""

    kind: FaultKind
    target: str
    at: float
    held_s: float
    healed: float | None = None
    lost_term: int | None = None
    """For a leader's loss: the term it held (a takeover is a heartbeat of a later one)."""
    note: str = ""


@dataclass
class Record:
    """Everything a run's checks read."""

    desired: list[DesiredValue] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    leader: list[LeaderBeat] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    accounted: list[Allocation] = field(default_factory=list)
    usage: dict[str, Usage] = field(default_factory=dict)
    usage_now: float = 0.0
    """The `now` accounting's report counted open allocations to."""
    api: dict[str, ApiView] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    mirror_gaps: int = 0
    """Values of the bucket the mirror never got (sequences missing from it)."""
    mirror_gap_spans: list[tuple[float, float, int]] = field(default_factory=list)
    """Where it missed them: (the time of the value before, of the value after, how many)."""
    ended: float = 0.0
    """When the record was read: what is still true then is true at the end."""


def clock(at: float) -> str:
    """A wall-clock time as evidence shows it: `HH:MM:SS.mmm` (UTC)."""
    moment = datetime.datetime.fromtimestamp(at, tz=datetime.UTC)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
