"""What the machines say: inventories, observed states, and silence.

An agent's observed state moves a workload scheduled → starting → running, to failed with the
agent's reason, parking → parked and removing → removed. An observation counts for a row only
once the agent has applied the generation at which that row's target was set, so a report about
an older wish is never acted on.

Silence is judged by time since the last report: suspect after `suspect_after_s` (a note on its
workloads, no new work), lost after `lost_after_s` (its workloads fail with "machine lost" and
their capacity is released). A machine that comes back is told, by its desired state, to stop
what is no longer wanted, and takes new work once it has applied that.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

from einsora.common.schemas import (
    Inventory,
    ObservedPhase,
    ObservedState,
    ObservedWorkload,
    Target,
    WorkloadState,
    utcnow,
)
from einsora.scheduler import chain, drivers, reasons
from einsora.scheduler.book import Book
from einsora.scheduler.model import Liveness, Machine, Row, Workload
from einsora.scheduler.routes import set_route

log = logging.getLogger("einsora.scheduler.observe")

_BEFORE_RUNNING = frozenset({WorkloadState.scheduled, WorkloadState.starting})
_CAN_FAIL = frozenset({WorkloadState.scheduled, WorkloadState.starting, WorkloadState.running})


def apply_inventory(book: Book, inventory: Inventory, seen_at: float) -> Machine | None:
    """A machine joined or its inventory changed; returns it, or None if not of this region."""
    if inventory.region != book.region:
        if inventory.machine_id in book.machines:
            log.warning(
                "a machine now reports another region; it keeps what it has here",
                extra={"machine_id": inventory.machine_id, "region": inventory.region},
            )
        return None
    machine = book.machines.get(inventory.machine_id)
    if machine is None:
        machine = Machine(
            machine_id=inventory.machine_id,
            region=inventory.region,
            inventory=inventory,
            last_seen=seen_at,
        )
        book.add_machine(machine, new=True)
        _say_if_sim_ignored(book, machine)
        return machine
    heartbeat(book, machine, seen_at)
    if _same(machine.inventory, inventory):
        return machine
    machine.inventory = inventory
    book.save_machine(machine)
    book.machine_changed(machine)
    _say_if_sim_ignored(book, machine)
    _stop_work_on_lost_devices(book, machine)
    return machine


def _same(a: Inventory, b: Inventory) -> bool:
    return a.model_dump(exclude={"at"}) == b.model_dump(exclude={"at"})


def _stop_work_on_lost_devices(book: Book, machine: Machine) -> None:
    healthy = {uuid for uuids in machine.gpus_by_class.values() for uuid in uuids}
    for row, workload in book.rows_on(machine):
        gone = [uuid for uuid in row.gpus if uuid not in healthy]
        if not gone:
            continue
        book.release(machine, row, Target.parked)
        if workload is not None and workload.machine_id == machine.machine_id:
            book.drop_route(workload)
            if workload.state in _CAN_FAIL or workload.state is WorkloadState.parking:
                book.transition(
                    workload,
                    WorkloadState.failed,
                    reasons.device_gone(machine.machine_id, gone[0]),
                )


def apply_observed(book: Book, observed: ObservedState, seen_at: float) -> None:
    """Move each of the machine's workloads as far as its report allows."""
    machine = book.machines.get(observed.machine_id)
    if machine is None:
        return
    # The changes it reports happened when the report arrived (our clock, not the agent's).
    book.event_at = wall_clock_of(seen_at)
    try:
        _apply_observed(book, machine, observed, seen_at)
    finally:
        book.event_at = None


def wall_clock_of(monotonic_s: float) -> datetime:
    """The wall-clock moment of a monotonic reading taken on this host (now, if it is none:
    a machine known only from the store has no reading until it reports)."""
    ago = time.monotonic() - monotonic_s
    return utcnow() - timedelta(seconds=ago) if math.isfinite(ago) and ago > 0 else utcnow()


def _apply_observed(book: Book, machine: Machine, observed: ObservedState, seen_at: float) -> None:
    heartbeat(book, machine, seen_at)
    was_placeable = machine.placeable
    machine.observed_generation = observed.generation_applied
    if observed.generation_applied > machine.generation:
        # Only a restored store lags what the agent applied; go past it so the agent listens.
        book.raise_generation_above(machine, observed.generation_applied)
    if machine.placeable != was_placeable:
        book.machine_changed(machine)
    reported = {w.workload_id: w for w in observed.workloads}
    for row, workload in book.rows_on(machine):
        if observed.generation_applied < row.since_generation:
            continue
        _observe_row(book, machine, row, workload, reported.get(row.workload_id))


def _observe_row(
    book: Book,
    machine: Machine,
    row: Row,
    workload: Workload | None,
    seen: ObservedWorkload | None,
) -> None:
    here = workload is not None and workload.machine_id == machine.machine_id
    if row.target is Target.removed:
        removing = here and workload is not None and workload.state is WorkloadState.removing
        if seen is None or seen.phase is ObservedPhase.removed:
            book.drop_row(machine, row.workload_id)
            if removing and workload is not None:
                book.transition(
                    workload, WorkloadState.removed, reasons.removed(machine.machine_id)
                )
        elif seen.phase is ObservedPhase.failed and removing and workload is not None:
            # Stopped but not cleaned up: the row stays, so a later remove tries again.
            book.release(machine, row, Target.removed)
            book.transition(
                workload, WorkloadState.failed, reasons.failed(machine.machine_id, seen.reason)
            )
        return
    if not here or workload is None:
        return
    if row.target is Target.parked:
        if workload.state is WorkloadState.parking and (
            seen is None or seen.phase in (ObservedPhase.parked, ObservedPhase.failed)
        ):
            book.release(machine, row, Target.parked)
            how = seen.reason if seen is not None and seen.phase is ObservedPhase.parked else ""
            book.transition(workload, WorkloadState.parked, reasons.parked(machine.machine_id, how))
        elif (
            workload.state is WorkloadState.failed
            and workload.reason.startswith(reasons.MACHINE_LOST)
            and seen is not None
            and seen.phase is ObservedPhase.failed
            and seen.reason
        ):
            # Back from being lost, its agent says how it ended there (it stopped it itself,
            # cut off: ADR-0029); once, as the reason then no longer says "machine lost".
            why = reasons.failed_while_cut_off(machine.machine_id, seen.reason)
            book.transition(workload, WorkloadState.failed, why)
        return
    if seen is None:
        return
    if seen.phase is ObservedPhase.failed and workload.state in _CAN_FAIL:
        book.release(machine, row, Target.parked)
        book.drop_route(workload)
        book.transition(
            workload, WorkloadState.failed, reasons.failed(machine.machine_id, seen.reason)
        )
    elif seen.phase is ObservedPhase.starting and workload.state is WorkloadState.scheduled:
        book.transition(workload, WorkloadState.starting, reasons.starting(machine.machine_id))
    elif seen.phase is ObservedPhase.running and workload.state in _BEFORE_RUNNING:
        book.transition(workload, WorkloadState.running, reasons.running(machine.machine_id))
        if seen.endpoint is not None:
            set_route(book, workload, machine, seen.endpoint)
    elif (
        seen.phase is ObservedPhase.running
        and workload.state is WorkloadState.running
        and seen.endpoint is not None
        and book.routes.get(workload.workload_id) != seen.endpoint
    ):
        set_route(book, workload, machine, seen.endpoint)


def heartbeat(book: Book, machine: Machine, seen_at: float) -> None:
    machine.last_seen = max(machine.last_seen, seen_at)


@contextlib.contextmanager
def silence_from_the_bus(book: Book, unseen: set[str]) -> Iterator[None]:
    """Time the silence of the machines in `unseen`, given a grace period at the book's load,
    from the heartbeats the values applied inside carry (their times on the bus), not from the
    load: after a takeover or a reload a silent machine is lost `lost_after_s` after its real
    last sign of life (issue 35, F7). A machine none of them speaks of keeps its grace. Empties
    `unseen`: only the first reading after a load replaces the grace."""
    graced: dict[str, float] = {}
    for machine_id in unseen:
        machine = book.machines.get(machine_id)
        if machine is not None and machine.liveness is not Liveness.lost:
            graced[machine_id] = machine.last_seen
            machine.last_seen = -math.inf
    unseen.clear()
    try:
        yield
    finally:
        for machine_id, grace in graced.items():
            machine = book.machines.get(machine_id)
            if machine is not None and machine.last_seen == -math.inf:
                machine.last_seen = grace


def next_liveness(
    current: Liveness, silent_s: float, suspect_after_s: float, lost_after_s: float
) -> Liveness:
    """Alive while it reports; suspect when silent a while; lost when silent too long.

    A lost machine stays lost until it reports again.
    """
    if silent_s < suspect_after_s:
        return Liveness.alive
    if current is Liveness.lost or silent_s >= lost_after_s:
        return Liveness.lost
    return Liveness.suspect


def check_liveness(book: Book, now: float, suspect_after_s: float, lost_after_s: float) -> None:
    """Judge every machine's silence at `now` (monotonic seconds)."""
    for machine in book.machines.values():
        silent = now - machine.last_seen
        new = next_liveness(machine.liveness, silent, suspect_after_s, lost_after_s)
        if new is not machine.liveness:
            _change_liveness(book, machine, new, silent, lost_after_s)


def _change_liveness(
    book: Book, machine: Machine, new: Liveness, silent_s: float, lost_after_s: float
) -> None:
    old, machine.liveness = machine.liveness, new
    log.info(
        "machine liveness changed",
        extra={"machine_id": machine.machine_id, "from": old.value, "to": new.value},
    )
    book.save_machine(machine)
    mine = [
        (row, w)
        for row, w in book.rows_on(machine)
        if w is not None and w.machine_id == machine.machine_id
    ]
    if new is Liveness.suspect:
        for _, workload in mine:
            if workload.state in _CAN_FAIL or workload.state is WorkloadState.parking:
                book.note(workload, reasons.suspect(machine.machine_id, silent_s, lost_after_s))
    elif new is Liveness.lost:
        # Its workloads stopped being seen at its last heartbeat: their allocations end there.
        book.event_at = wall_clock_of(machine.last_seen)
        try:
            _lose(book, machine, mine, silent_s)
        finally:
            book.event_at = None
    elif old is Liveness.suspect:
        for _, workload in mine:
            if workload.state in _CAN_FAIL or workload.state is WorkloadState.parking:
                book.note(workload, reasons.reports_again(machine.machine_id))
    else:
        machine.settle_generation = machine.generation
        for row, workload in mine:
            if workload.state is WorkloadState.failed and row.target is Target.parked:
                book.note(workload, reasons.machine_back(machine.machine_id))
    book.machine_changed(machine)


def revoke(book: Book, machine: Machine) -> None:
    """The machine's enrolment was revoked: its workloads fail ("machine revoked"), their routes
    go and their devices are released (their allocations close); it takes no work again."""
    if machine.revoked:
        return
    machine.revoked = True
    log.warning("machine revoked", extra={"machine_id": machine.machine_id})
    for row, workload in book.rows_on(machine):
        if workload is None or workload.machine_id != machine.machine_id:
            if row.holds_resources:
                book.release(machine, row, row.target)
            continue
        if workload.state in _CAN_FAIL or workload.state is WorkloadState.parking:
            book.release(machine, row, Target.parked)
            book.drop_route(workload)
            book.transition(workload, WorkloadState.failed, reasons.revoked(machine.machine_id))
            # Opted in to fallback: it is placed again by its chain (ADR-0022).
            chain.after_eviction(book, workload, f"{machine.machine_id} was revoked")
        elif workload.state is WorkloadState.removing:
            book.release(machine, row, Target.removed)
            book.transition(
                workload, WorkloadState.removed, reasons.removed_while_revoked(machine.machine_id)
            )
        elif row.holds_resources:
            book.release(machine, row, row.target)
    book.machine_changed(machine)


def _lose(book: Book, machine: Machine, mine: list[tuple[Row, Workload]], silent_s: float) -> None:
    for row, workload in mine:
        if workload.state in _CAN_FAIL or workload.state is WorkloadState.parking:
            book.release(machine, row, Target.parked)
            book.drop_route(workload)
            book.transition(
                workload, WorkloadState.failed, reasons.lost(machine.machine_id, silent_s)
            )
        elif workload.state is WorkloadState.removing:
            book.release(machine, row, Target.removed)
            book.transition(
                workload, WorkloadState.removed, reasons.removed_while_lost(machine.machine_id)
            )
    for row, _ in book.rows_on(machine):
        if row.holds_resources:
            book.release(machine, row, row.target)


def _say_if_sim_ignored(book: Book, machine: Machine) -> None:
    """A machine reports the sim driver in a cell that does not allow it: said once in the log."""
    ignored = drivers.ignores_sim(machine.inventory, sim_machines=book.sim_machines)
    if ignored and machine.machine_id not in book.sim_ignored:
        book.sim_ignored.add(machine.machine_id)
        log.warning(
            "a machine reports the sim driver, which this cell does not allow: it is "
            f"ignored (set {drivers.SIM_SETTING} to allow sim machines)",
            extra={"machine_id": machine.machine_id},
        )
