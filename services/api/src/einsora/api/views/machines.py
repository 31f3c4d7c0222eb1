"""What the api knows of machines: each one's enrolment, inventory and observed state, from KV.

The api is a trusted client of the bus, so it mirrors the `enrolments` bucket (which it writes from
its store) and the `machines` bucket's inventory and observed keys (desired values are the
scheduler's and can be large) with `KvMirror`s, and keeps the latest of each in memory for
`/v1/machines`, `/v1/classes` and `/v1/regions`. Each inventory teaches the catalog the classes
derived from its devices (automatic and MIG classes), so a launch may name them as soon as a machine
offers them. A value that does not parse, or is over its limits (an inventory over
`Inventory.MAX_BYTES` is not even parsed), is skipped and said in one log line naming the machine
until it sends a readable one. A machine's values are read at a bounded pace, the latest kept
(`Pacer`): one machine rewriting its keys in a loop costs the api one parse per interval (issue
34, N7). The mirrors re-read their buckets after a reconnect and on a period, so a restarted
server's lost consumer never leaves the view stale for ever.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import ValidationError

from einsora.common.bus import KvMirror, names
from einsora.common.bus.pace import MACHINE_REPORT_EVERY_S, Pacer
from einsora.common.catalog import Catalog
from einsora.common.schemas import Enrolment, Inventory, ObservedPhase, ObservedState
from einsora.common.schemas.base import what_is_wrong

log = logging.getLogger("einsora.api.views.machines")

_KINDS = ("inventory", "observed")
AUDIT_S = 60.0


@dataclass
class MachineRecord:
    """The latest inventory and observed state of one machine (either may be missing)."""

    machine_id: str
    inventory: Inventory | None = None
    observed: ObservedState | None = None
    enrolment: Enrolment | None = None

    @property
    def region(self) -> str | None:
        """Its enrolment's region (never the inventory's claim); None unless enrolled and live."""
        if self.enrolment is None or self.enrolment.revoked:
            return None
        return self.enrolment.region

    @property
    def empty(self) -> bool:
        return self.inventory is None and self.observed is None and self.enrolment is None

    @property
    def heartbeat_at(self) -> datetime | None:
        return self.observed.heartbeat_at if self.observed else None

    @property
    def workload_count(self) -> int:
        if self.observed is None:
            return 0
        return sum(1 for w in self.observed.workloads if w.phase is not ObservedPhase.removed)


class MachinesView:
    """An in-memory view of the `machines` bucket, kept current by a KV mirror."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.catalog = catalog
        """Learns the classes derived from each inventory seen (None: no catalog to teach)."""
        self._records: dict[str, MachineRecord] = {}
        self._mirror: KvMirror | None = None
        self._enrolments: KvMirror | None = None
        self._pacer: Pacer[str, bytes | None] = Pacer(
            self._apply_now, lambda key: MACHINE_REPORT_EVERY_S[key.rsplit(".", 1)[-1]]
        )
        self._refused: set[str] = set()
        """Keys whose latest value was refused: said once, until a readable one comes."""

    def snapshot(self) -> list[MachineRecord]:
        """Every machine known now, by id."""
        return [self._records[k] for k in sorted(self._records)]

    async def start(self, nc: NATS, js: JetStreamContext, *, sync_timeout_s: float = 5.0) -> None:
        """Start mirroring; returns once the current values are loaded (or after the timeout,
        the mirror still trying)."""
        self._mirror = KvMirror(
            nc,
            js,
            names.MACHINES,
            keys=tuple(f"*.{kind}" for kind in _KINDS),
            on_put=self.apply,
            on_delete=lambda key: self.apply(key, None),
            audit_s=AUDIT_S,
        )
        self._enrolments = KvMirror(
            nc,
            js,
            names.ENROLMENTS,
            on_put=self.apply_enrolment,
            on_delete=lambda key: self.apply_enrolment(key, None),
            audit_s=AUDIT_S,
        )
        for mirror in (self._enrolments, self._mirror):
            with contextlib.suppress(TimeoutError):
                await mirror.start(sync_timeout_s=sync_timeout_s)

    async def stop(self) -> None:
        for mirror in (self._mirror, self._enrolments):
            if mirror is not None:
                await mirror.stop()
        self._mirror = self._enrolments = None
        self._pacer.clear()

    def apply_enrolment(self, machine_id: str, value: bytes | None) -> None:
        """Take one enrolment (None: deleted) into the view."""
        record = self._records.setdefault(machine_id, MachineRecord(machine_id))
        try:
            record.enrolment = Enrolment.from_bytes(value) if value else None
        except ValidationError as exc:
            why = str(exc)
            log.warning("unreadable enrolment skipped", extra={"key": machine_id, "error": why})
        if record.empty:
            del self._records[machine_id]

    def apply(self, key: str, value: bytes | None) -> None:
        """Take one KV entry (None: deleted) into the view, at its machine's pace."""
        try:
            _, kind = names.split_machine_key(key)
        except ValueError:
            return
        if kind in _KINDS:
            self._pacer.offer(key, value)

    def _apply_now(self, key: str, value: bytes | None) -> None:
        machine_id, kind = names.split_machine_key(key)
        record = self._records.setdefault(machine_id, MachineRecord(machine_id))
        try:
            if kind == "inventory":
                if value and len(value) > Inventory.MAX_BYTES:
                    raise ValueError(
                        f"the inventory is {len(value)} bytes, over the {Inventory.MAX_BYTES} "
                        "an inventory may have"
                    )
                inventory = Inventory.from_bytes(value) if value else None
                record.inventory = inventory
                if inventory is not None and self.catalog is not None:
                    self.catalog.learn(inventory)
            else:
                record.observed = ObservedState.from_bytes(value) if value else None
        except ValueError as exc:  # a ValidationError too
            if key not in self._refused:
                self._refused.add(key)
                error = what_is_wrong(exc) if isinstance(exc, ValidationError) else str(exc)
                log.warning(
                    "a machine's value skipped (unreadable, or over its limits) until it sends "
                    "a readable one",
                    extra={"machine_id": machine_id, "key": key, "error": error[:1000]},
                )
        else:
            self._refused.discard(key)
        if record.empty:
            del self._records[machine_id]
