"""Reading the `machines` bucket into the book: inventories, observed states, desired keys.

Only enrolled machines count (the `enrolments` bucket, written by the api): an inventory or a
report from a machine that is not enrolled, or was revoked, is ignored and logged, and is
applied once the machine's enrolment arrives. A machine's region is its enrolment's, never the
one its inventory claims. Values are checked against the key they came under (an agent's
payload never decides which machine it is).

What a machine says is bounded (issue 34, N7): an inventory over `Inventory.MAX_BYTES` is refused
unread, and a value outside its schema's limits is refused; either is said in one log line
naming the machine, not once per rewrite, until the machine sends a readable value again.

Most observed values are only heartbeats: when a report says what the last full reading said,
on a machine whose rows have not changed since, it only refreshes the machine's last sign of
life. A desired key that is deleted, lags the store, or was written by someone else
is marked for rewriting from the store.
"""

from __future__ import annotations

import json
import logging

from pydantic import ValidationError

from einsora.common.schemas import Enrolment, Inventory, ObservedState, utcnow
from einsora.common.schemas.base import what_is_wrong
from einsora.scheduler.book import Book
from einsora.scheduler.model import Machine
from einsora.scheduler.observe import apply_inventory, apply_observed, heartbeat, revoke
from einsora.scheduler.projection import Projector
from einsora.scheduler.watch import MachineKey

log = logging.getLogger("einsora.scheduler.machines")


class MachineReader:
    """Applies machine values to a book and keeps what a reload needs to replay."""

    def __init__(self, projector: Projector) -> None:
        self.projector = projector
        self._latest: dict[tuple[str, str], MachineKey] = {}
        self._observed: dict[str, tuple[object, int]] = {}
        """Each machine's last fully read report (without its heartbeat), and its generation."""
        self.enrolments: dict[str, Enrolment] = {}
        self._ignored: set[str] = set()
        """Machines whose values were ignored (not enrolled), logged once each."""
        self._refused: set[tuple[str, str]] = set()
        """(machine, kind) whose latest value was refused, logged once until a readable one."""
        self.timed_by_bus = True
        """Whether a value read again is timed by when the bus stored it; False after a load
        with no leader for long (the whole cell was down): then every machine is given a grace
        period from now, as if it had just reported (issue 35, F7)."""

    def apply_enrolment(
        self, book: Book, machine_id: str, enrolment: Enrolment | None, now: float
    ) -> None:
        """A machine's enrolment arrived, changed or went (None): it counts, or no longer."""
        had = self.enrolments.get(machine_id)
        if enrolment is not None and enrolment.machine_id != machine_id:
            log.warning(
                "an enrolment names another machine than its key; ignored",
                extra={"machine_id": machine_id},
            )
            return
        if enrolment is None:
            # Gone from the bucket (a bus that came back empty): its reports wait until the
            # api puts it back. Only a revocation fails its workloads.
            self.enrolments.pop(machine_id, None)
            return
        self.enrolments[machine_id] = enrolment
        machine = book.machines.get(machine_id)
        if machine is not None:
            _take_enrolment(book, machine, enrolment)
        if enrolment.revoked:
            if machine is not None:
                revoke(book, machine)
            return
        if had is None or had.region != enrolment.region:
            # What it reported before it was enrolled counts now.
            self._ignored.discard(machine_id)
            for kind in ("inventory", "observed"):
                kept = self._latest.get((machine_id, kind))
                if kept is not None:
                    self.apply(book, kept, now, live=False)

    def _enrolled(self, key: MachineKey) -> Enrolment | None:
        enrolment = self.enrolments.get(key.machine_id)
        if enrolment is not None and not enrolment.revoked:
            return enrolment
        if key.machine_id not in self._ignored:
            self._ignored.add(key.machine_id)
            log.warning(
                "a machine that is not enrolled (or was revoked) reports; ignored",
                extra={
                    "machine_id": key.machine_id,
                    "revoked": enrolment is not None,
                    "kind": key.kind,
                },
            )
        return None

    def keep(self, key: MachineKey) -> None:
        """Remember the latest inventory and observed value of each machine."""
        if key.kind != "desired" and not key.deleted:
            self._latest[(key.machine_id, key.kind)] = key

    def latest_values(self) -> list[MachineKey]:
        return list(self._latest.values())

    def forget_reports(self) -> None:
        """After a reload, every report is read in full again."""
        self._observed.clear()

    def apply_snapshot(self, book: Book, keys: list[MachineKey], now: float) -> None:
        """A snapshot of the whole bucket: values applied, desired states compared."""
        self.projector.written_revision.clear()
        if self.projector.per_key:  # each key's revision, judged below (projection.py)
            self.projector.revisions = {
                k.machine_id: k.revision for k in keys if k.kind == "desired"
            }
        in_kv: dict[str, int | None] = {}
        for key in sorted(keys, key=lambda k: k.kind != "inventory"):
            if key.kind == "desired":
                in_kv[key.machine_id] = None if key.deleted else _generation(key.value)
            else:
                self.apply(book, key, now, live=False)
        for machine in book.machines.values():
            seen = in_kv.get(machine.machine_id)
            if seen is not None and seen > machine.generation:
                book.raise_generation_above(machine, seen)
            if seen != machine.generation:
                self.projector.dirty.add(machine.machine_id)

    def apply(self, book: Book, key: MachineKey, now: float, *, live: bool) -> None:
        """One value; `live` when just received. Either way it is timed by when the bus stored
        it, never by the agent's clock nor by when this scheduler got round to it (issue 35,
        F7): a scheduler behind on its reading would otherwise meter a lost machine's GPUs
        for the time it took to read its last report. The server's and this host's clocks are
        taken to agree (NTP), as the leader lease already takes them to."""
        if key.kind == "desired":
            self._desired_changed(book, key)
            return
        if key.deleted:
            return
        self.keep(key)
        enrolment = self._enrolled(key)
        if enrolment is None:
            return
        seen_at = now - _age_s(key) if self.timed_by_bus else now
        try:
            if key.kind == "inventory":
                if len(key.value) > Inventory.MAX_BYTES:
                    raise ValueError(
                        f"the inventory is {len(key.value)} bytes, over the "
                        f"{Inventory.MAX_BYTES} an inventory may have"
                    )
                inventory = Inventory.from_bytes(key.value)
                if inventory.machine_id != key.machine_id:
                    raise ValueError("the inventory names another machine than its key")
                if inventory.region != enrolment.region:
                    inventory = inventory.model_copy(update={"region": enrolment.region})
                machine = apply_inventory(book, inventory, seen_at)
                if machine is not None:
                    _take_enrolment(book, machine, enrolment)
            elif not (live and self._only_a_heartbeat(book, key, seen_at)):
                observed = ObservedState.from_bytes(key.value)
                if observed.machine_id != key.machine_id:
                    raise ValueError("the observed state names another machine than its key")
                apply_observed(book, observed, seen_at)
                self._remember_observed(book, key)
        except (ValidationError, ValueError) as exc:
            self._refuse(key, exc)
            return
        self._refused.discard((key.machine_id, key.kind))

    def _refuse(self, key: MachineKey, exc: ValueError) -> None:
        """One line per machine and kind, until it sends a readable value again."""
        if (key.machine_id, key.kind) in self._refused:
            return
        self._refused.add((key.machine_id, key.kind))
        error = what_is_wrong(exc) if isinstance(exc, ValidationError) else str(exc)
        log.warning(
            "a machine's value refused (unreadable, or over its limits); its last readable "
            "one stands until it sends another",
            extra={"machine_id": key.machine_id, "kind": key.kind, "error": error[:1000]},
        )

    def _only_a_heartbeat(self, book: Book, key: MachineKey, seen_at: float) -> bool:
        """The same report as last time, but for its heartbeat, on an unchanged machine.

        Every agent writes its observed state every few seconds; most of those writes say
        nothing new, and a thousand machines' worth of full readings would hold up intents.
        """
        machine = book.machines.get(key.machine_id)
        last = self._observed.get(key.machine_id)
        if machine is None or last is None or last[1] != machine.generation:
            return False
        try:
            report = json.loads(key.value)
            report.pop("heartbeat_at", None)
        except ValueError:
            return False
        if report != last[0]:
            return False
        heartbeat(book, machine, seen_at)
        return True

    def _remember_observed(self, book: Book, key: MachineKey) -> None:
        machine = book.machines.get(key.machine_id)
        if machine is None:
            return
        try:
            report = json.loads(key.value)
        except ValueError:
            return
        report.pop("heartbeat_at", None)
        self._observed[key.machine_id] = (report, machine.generation)

    def rewrite_missing(self, book: Book, present: set[str]) -> None:
        """Desired keys the audit did not find are rewritten (a purge leaves no marker)."""
        missing = set(book.machines) - present - self.projector.dirty
        if missing:
            log.warning(
                "desired states missing from the bucket; rewriting them from the store",
                extra={"machines": len(missing)},
            )
            self.projector.dirty |= missing

    def _desired_changed(self, book: Book, key: MachineKey) -> None:
        machine = book.machines.get(key.machine_id)
        if machine is None:
            return
        if key.revision <= self.projector.written_revision.get(key.machine_id, 0):
            return  # our own write coming back, or an older one
        if self.projector.per_key:  # judged below: what our next write of the key expects
            revisions = self.projector.revisions
            revisions[key.machine_id] = max(key.revision, revisions.get(key.machine_id, 0))
        seen = None if key.deleted else _generation(key.value)
        writing = self.projector.writing.get(key.machine_id)
        if seen is not None and writing is not None and seen <= writing:
            return  # our own write coming back before its ack, or an older one
        if seen is not None and seen > machine.generation:
            book.raise_generation_above(machine, seen)
        if seen != machine.generation:
            log.warning(
                "a desired state in KV is missing or not ours; rewriting it from the store",
                extra={"machine_id": machine.machine_id},
            )
            self.projector.dirty.add(machine.machine_id)


def _take_enrolment(book: Book, machine: Machine, enrolment: Enrolment) -> None:
    """What placement reads of a machine's enrolment: how it is reached, whose it is, who else
    may use it, and what its owner lends of it. A change of who may use it, or of the lend, is
    re-filed like a change of capacity."""
    machine.tunnel = enrolment.tunnel
    machine.address = enrolment.address
    machine.enrolled = True
    machine.reclaim_grace_s = enrolment.reclaim_grace_s
    machine.guest_min_runtime_s = enrolment.guest_min_runtime_s
    sharing = (
        enrolment.owner_tenant_id,
        enrolment.sharing,
        frozenset(enrolment.guests),
        frozenset(enrolment.guest_users),
        enrolment.reclaimed_at,
        None if enrolment.lend is None or enrolment.lend.everything else enrolment.lend,
    )
    now = (
        machine.owner_tenant,
        machine.sharing,
        machine.guests,
        machine.guest_users,
        machine.enrolment_reclaimed_at,
        machine.lend,
    )
    if now != sharing:
        (
            machine.owner_tenant,
            machine.sharing,
            machine.guests,
            machine.guest_users,
            machine.enrolment_reclaimed_at,
            machine.lend,
        ) = sharing
        book.machine_changed(machine)


def _age_s(key: MachineKey) -> float:
    """How long ago the bus stored the value (0 when it did not say)."""
    if key.stored_at is None:
        return 0.0
    return max(0.0, (utcnow() - key.stored_at).total_seconds())


def _generation(value: bytes) -> int | None:
    try:
        generation = json.loads(value)["generation"]
    except (ValueError, KeyError, TypeError):
        return None
    return generation if isinstance(generation, int) else None
