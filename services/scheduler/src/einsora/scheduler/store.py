"""The scheduler's store: load the book at start, and commit each cycle's changes at once.

One transaction per cycle holds everything the cycle decided: machines (generation, liveness,
inventory), workloads, desired rows, GPU bookings, the intents it processed and the events it
will publish (the outbox). It commits before anything reaches the bus (ADR-0004), so whatever
the bus shows, the store has; and after a crash the store alone rebuilds the rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from einsora.common.bus import names
from einsora.common.errors import EinsoraError
from einsora.common.schemas import (
    Inventory,
    Target,
    WorkloadEvent,
    WorkloadIntent,
    WorkloadKind,
    WorkloadState,
    utcnow,
)
from einsora.scheduler import tables as t
from einsora.scheduler.book import Changes, Handoff, OutboxEvent
from einsora.scheduler.model import Chain, Liveness, Machine, Row, Workload
from einsora.store import Database, is_postgres
from einsora.store.statements import execute

log = logging.getLogger("einsora.scheduler.store")

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_scheduler"
INTENT_MEMORY = timedelta(days=8)
"""How long a processed intent's id is kept: longer than INTENTS keeps a message (7 days)."""


@dataclass
class Snapshot:
    """Everything the book is rebuilt from."""

    machines: list[Machine]
    workloads: list[Workload]
    outbox: list[OutboxEvent]
    handoffs: list[Handoff]


class SchedulerStore(Database):
    """The scheduler's tables behind an async engine (SQLite or Postgres), with the store's one
    transaction policy: in Solo it shares the api's file, and its writes take turns with the
    api's rather than failing (einsora.store.database).

    With `lease_s` (a region's schedulers share a Postgres database), a transaction left idle
    that long is ended by the server: a leader frozen (SIGSTOPped) in the middle of a commit
    holds the lease row's lock, and would otherwise keep every standby from taking the term
    until it woke (issue 35). No commit of a live leader idles between its statements for a
    whole lease; one that did was deposed anyway. A takeover waits that long for the lock at
    most, then tries again."""

    def __init__(self, url: str, *, lease_s: float | None = None, **engine_options: Any) -> None:
        self.lease_s = lease_s
        if lease_s is not None and is_postgres(url):
            connect_args = engine_options.setdefault("connect_args", {})
            settings = connect_args.setdefault("server_settings", {})
            settings["idle_in_transaction_session_timeout"] = str(max(1, round(lease_s * 1000)))
        super().__init__(url, **engine_options)

    async def migrate(self) -> None:  # type: ignore[override]
        await super().migrate(MIGRATIONS, version_table=VERSION_TABLE)

    async def forget_old_intents(self, older_than: timedelta = INTENT_MEMORY) -> int:
        """Forget processed intents JetStream can no longer redeliver (INTENTS keeps 7 days)."""
        async with self.write() as conn:
            result = await conn.execute(
                t.processed_intents.delete().where(
                    t.processed_intents.c.processed_at < utcnow() - older_than
                )
            )
        return int(result.rowcount or 0)

    # --- reading ----------------------------------------------------------------------------

    async def load(self, region: str) -> Snapshot:
        async with self.read() as conn:
            machines = {
                r.machine_id: _machine(r)
                for r in await conn.execute(
                    sa.select(t.machines).where(t.machines.c.region == region)
                )
            }
            rows = await conn.execute(
                sa.select(t.desired_rows).where(
                    t.desired_rows.c.machine_id.in_(
                        sa.select(t.machines.c.machine_id).where(t.machines.c.region == region)
                    )
                )
            )
            for r in rows:
                machines[r.machine_id].rows[r.workload_id] = _row(r)
            active = await conn.execute(
                sa.select(t.workloads).where(
                    t.workloads.c.region == region,
                    t.workloads.c.state != WorkloadState.removed.value,
                )
            )
            workloads = {r.workload_id: _workload(r) for r in active}
            referenced = {w for m in machines.values() for w in m.rows} - workloads.keys()
            for chunk in _chunks(sorted(referenced)):
                for r in await conn.execute(
                    sa.select(t.workloads).where(t.workloads.c.workload_id.in_(chunk))
                ):
                    workloads[r.workload_id] = _workload(r)
            outbox = [
                OutboxEvent(WorkloadEvent.from_bytes(r.payload), r.request_id)
                for r in await conn.execute(
                    sa.select(t.outbox).order_by(t.outbox.c.workload_id, t.outbox.c.seq)
                )
            ]
            handoffs = [
                Handoff(WorkloadIntent.from_bytes(r.payload), r.request_id)
                for r in await conn.execute(sa.select(t.handoffs))
            ]
        return Snapshot(list(machines.values()), list(workloads.values()), outbox, handoffs)

    async def screen(
        self, intent_ids: Sequence[str], workload_ids: Sequence[str]
    ) -> tuple[set[str], dict[str, tuple[WorkloadState, str]]]:
        """Which of these intents were processed already, and which of these workloads the
        store knows (with their state and the region that holds them), in one call to the
        database."""

        def read(conn: sa.Connection) -> tuple[set[str], dict[str, tuple[WorkloadState, str]]]:
            seen: set[str] = set()
            for chunk in _chunks(intent_ids):
                result = conn.execute(
                    sa.select(t.processed_intents.c.intent_id).where(
                        t.processed_intents.c.intent_id.in_(chunk)
                    )
                )
                seen.update(result.scalars())
            return seen, _known(conn, workload_ids)

        return await self.query(read)

    async def states_of(self, workload_ids: Sequence[str], region: str) -> dict[str, WorkloadState]:
        """The state of each of these workloads that the store knows `region` holds (one that
        region handed over is the next region's to speak for: ADR-0022)."""
        known = await self.query(lambda conn: _known(conn, workload_ids))
        return {w: state for w, (state, held_by) in known.items() if held_by == region}

    # --- writing ----------------------------------------------------------------------------

    fence: tuple[str, int] | None = None
    """(region, term) every commit checks first: the leader's term (lease.py); None: none."""

    async def commit(self, changes: Changes, published: Sequence[str]) -> None:
        """Write one cycle's changes in one transaction; forget the outbox rows `published`.
        Raises `Deposed` (and writes nothing) when the region's term moved past the fence."""
        fence = self.fence
        await self.run(lambda conn: _commit(conn, changes, published, fence))

    async def take_term(self, region: str, term: int, holder: str) -> bool:
        """Raise the region's term to `term` for `holder`; False when the store already has a
        term as high (another scheduler took the lease after us)."""

        lock_timeout_ms = None if self.lease_s is None else max(1, round(self.lease_s * 1000))

        def take(conn: sa.Connection) -> bool:
            if lock_timeout_ms is not None and conn.dialect.name == "postgresql":
                conn.execute(sa.text(f"SET LOCAL lock_timeout = {lock_timeout_ms}"))
            row = conn.execute(
                sa.select(t.leases.c.term).where(t.leases.c.region == region).with_for_update()
            ).first()
            if row is None:
                conn.execute(t.leases.insert().values(region=region, term=term, holder=holder))
                return True
            if row.term >= term:
                return False
            conn.execute(
                t.leases.update()
                .where(t.leases.c.region == region)
                .values(term=term, holder=holder)
            )
            return True

        try:
            return await self.run(take)
        except DBAPIError as exc:
            if lock_timeout_ms is None or not _lock_not_available(exc):
                raise
        # The lease row's lock outlived a whole lease: a deposed leader holds it, frozen where
        # the idle-in-transaction timeout does not reach (its statement still active, say, in
        # the middle of a batch the frozen client never finished sending). Its commit would be
        # fenced anyway: its session is ended, so its transaction rolls back and frees the row.
        ended = await self.run(_end_lease_holders)
        log.warning(
            "a frozen scheduler held the lease row; its session was ended",
            extra={"region": region, "sessions": ended},
        )
        return await self.run(take)


def _lock_not_available(exc: DBAPIError) -> bool:
    """Postgres's lock_timeout (SQLSTATE 55P03), however the driver wraps it."""
    cause: BaseException | None = exc
    for _ in range(4):
        if cause is None:
            return False
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if code == "55P03" or "lock timeout" in str(cause):
            return True
        cause = getattr(cause, "orig", None) or cause.__cause__
    return False


def _end_lease_holders(conn: sa.Connection) -> int:
    """End every other session holding a lock on the leases table (Postgres only); how many.
    Only schedulers take that lock, and only one holding the lease may: the others are
    deposed, and the fence refuses their commits whatever happens here."""
    ended = conn.execute(
        sa.text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks "
            "WHERE relation = CAST(:table AS regclass) AND granted AND pid <> pg_backend_pid()"
        ),
        {"table": t.leases.name},
    ).scalar()
    return int(ended or 0)


class Deposed(EinsoraError):
    """Another scheduler holds this region's lease now: this one may decide nothing more."""

    code = "scheduler_deposed"
    retryable = True  # for the intents: they are the new leader's to decide


def _check_fence(conn: sa.Connection, fence: tuple[str, int]) -> None:
    # An UPDATE, not a SELECT: it takes the row's lock, so a takeover (take_term) and this
    # commit are ordered, and the loser sees the winner's term.
    region, term = fence
    if execute(conn, _FENCE, {"b_region": region, "b_term": term}).rowcount != 1:
        raise Deposed(f"the lease of region {region!r} moved past term {term}")


def _commit(
    conn: sa.Connection,
    changes: Changes,
    published: Sequence[str],
    fence: tuple[str, int] | None = None,
) -> None:
    if fence is not None:
        _check_fence(conn, fence)
    _save_machines(conn, changes)
    _save_workloads(conn, changes)
    _save_rows(conn, changes)
    if changes.intents:
        now = utcnow()
        execute(
            conn,
            _INSERT_PROCESSED,
            [
                {
                    "intent_id": i.intent_id,
                    "workload_id": i.workload_id,
                    "action": i.action,
                    "processed_at": now,
                }
                for i in changes.intents
            ],
        )
    if changes.events:
        execute(
            conn,
            _INSERT_OUTBOX,
            [
                {
                    "event_id": e.event.event_id,
                    "workload_id": e.event.workload_id,
                    "seq": e.event.seq,
                    "request_id": e.request_id,
                    "payload": e.event.to_bytes().decode(),
                }
                for e in changes.events
            ],
        )
    if published:
        execute(conn, _DELETE_OUTBOX, [{"b_id": event_id} for event_id in published])
    if changes.handoffs or changes.handoffs_sent:
        _save_handoffs(conn, changes)


def _save_handoffs(conn: sa.Connection, changes: Changes) -> None:
    """Intents for other regions decided this cycle, and those published since (ADR-0022)."""
    if changes.handoffs:
        execute(
            conn,
            _INSERT_HANDOFF,
            [
                {
                    "intent_id": h.intent.intent_id,
                    "workload_id": h.intent.workload_id,
                    "subject": names.intent_subject(h.intent.region, h.intent.workload_id),
                    "request_id": h.request_id,
                    "payload": h.intent.to_bytes().decode(),
                }
                for h in changes.handoffs
            ],
        )
    if changes.handoffs_sent:
        execute(conn, _DELETE_HANDOFF, [{"b_id": i} for i in changes.handoffs_sent])


def _known(
    conn: sa.Connection, workload_ids: Sequence[str]
) -> dict[str, tuple[WorkloadState, str]]:
    found: dict[str, tuple[WorkloadState, str]] = {}
    w = t.workloads.c
    for chunk in _chunks(workload_ids):
        result = conn.execute(
            sa.select(w.workload_id, w.state, w.region).where(w.workload_id.in_(chunk))
        )
        found.update({r.workload_id: (WorkloadState(r.state), r.region) for r in result})
    return found


def _save_machines(conn: sa.Connection, changes: Changes) -> None:
    new = [m for k, m in changes.machines.items() if k in changes.new_machines]
    old = [m for k, m in changes.machines.items() if k not in changes.new_machines]
    if new:
        execute(conn, _INSERT_MACHINE, [_machine_values(m) for m in new])
    if old:
        execute(
            conn,
            _UPDATE_MACHINE,
            [{f"b_{k}": v for k, v in _machine_values(m).items()} for m in old],
        )


def _machine_values(m: Machine) -> dict[str, Any]:
    return {
        "machine_id": m.machine_id,
        "region": m.region,
        "inventory": m.inventory.to_bytes().decode(),
        "generation": m.generation,
        "liveness": m.liveness.value,
    }


_WORKLOAD_MUTABLE = (
    "state",
    "reason",
    "machine_id",
    "seq",
    "pending_since",
    "request_id",
    "region",
    "placed_class",
    "fallback",
)

# The commit's statements, built once: `execute` hands them to the driver on SQLite.
_FENCE = (
    t.leases.update()
    .where(t.leases.c.region == sa.bindparam("b_region"), t.leases.c.term == sa.bindparam("b_term"))
    .values(term=t.leases.c.term)
)
_INSERT_MACHINE = t.machines.insert()
_UPDATE_MACHINE = (
    t.machines.update()
    .where(t.machines.c.machine_id == sa.bindparam("b_machine_id"))
    .values(
        inventory=sa.bindparam("b_inventory"),
        generation=sa.bindparam("b_generation"),
        liveness=sa.bindparam("b_liveness"),
    )
)
_INSERT_WORKLOAD = t.workloads.insert()
_UPDATE_WORKLOAD = (
    t.workloads.update()
    .where(t.workloads.c.workload_id == sa.bindparam("b_workload_id"))
    .values({c: sa.bindparam(f"b_{c}") for c in _WORKLOAD_MUTABLE})
)
_INSERT_ROW = t.desired_rows.insert()
_DELETE_ROW = t.desired_rows.delete().where(
    t.desired_rows.c.machine_id == sa.bindparam("b_m"),
    t.desired_rows.c.workload_id == sa.bindparam("b_w"),
)
_INSERT_BOOKING = t.gpu_bookings.insert()
_DELETE_BOOKINGS = t.gpu_bookings.delete().where(
    t.gpu_bookings.c.machine_id == sa.bindparam("b_m"),
    t.gpu_bookings.c.workload_id == sa.bindparam("b_w"),
)
_INSERT_PROCESSED = t.processed_intents.insert()
_INSERT_OUTBOX = t.outbox.insert()
_DELETE_OUTBOX = t.outbox.delete().where(t.outbox.c.event_id == sa.bindparam("b_id"))
_INSERT_HANDOFF = t.handoffs.insert()
_DELETE_HANDOFF = t.handoffs.delete().where(t.handoffs.c.intent_id == sa.bindparam("b_id"))


def _save_workloads(conn: sa.Connection, changes: Changes) -> None:
    new = [w for k, w in changes.workloads.items() if k in changes.new_workloads]
    old = [w for k, w in changes.workloads.items() if k not in changes.new_workloads]
    if new:
        execute(conn, _INSERT_WORKLOAD, [_workload_values(w) for w in new])
    if old:
        execute(
            conn,
            _UPDATE_WORKLOAD,
            [
                {f"b_{k}": v for k, v in _workload_values(w).items() if k in _WORKLOAD_MUTABLE}
                | {"b_workload_id": w.workload_id}
                for w in old
            ],
        )


def _workload_values(w: Workload) -> dict[str, Any]:
    return {
        "workload_id": w.workload_id,
        "tenant_id": w.tenant_id,
        "user_id": w.user_id,
        "region": w.region,
        "kind": w.kind.value,
        "name": w.name,
        "class_name": w.class_name,
        "count": w.count,
        "spec": json.dumps(w.spec),
        "state": w.state.value,
        "reason": w.reason,
        "machine_id": w.machine_id,
        "seq": w.seq,
        "pending_since": w.pending_since,
        "request_id": w.request_id,
        "created_at": w.created_at,
        "placed_class": w.placed_class,
        "fallback": w.chain.to_json() if w.chain is not None else None,
    }


def _save_rows(conn: sa.Connection, changes: Changes) -> None:
    if not changes.rows:
        return
    keys = [{"b_m": m, "b_w": w} for (m, w) in changes.rows if (m, w) not in changes.new_rows]
    if keys:
        _delete_rows(conn, keys)
    _insert_rows(conn, changes)


def _delete_rows(conn: sa.Connection, keys: list[dict[str, str]]) -> None:
    execute(conn, _DELETE_BOOKINGS, keys)
    execute(conn, _DELETE_ROW, keys)


def _insert_rows(conn: sa.Connection, changes: Changes) -> None:
    present = [(m, row) for (m, _), row in changes.rows.items() if row is not None]
    if present:
        execute(
            conn,
            _INSERT_ROW,
            [
                {
                    "machine_id": m,
                    "workload_id": row.workload_id,
                    "target": row.target.value,
                    "gpus": json.dumps(row.gpus),
                    "cpus": row.cpus,
                    "memory_mib": row.memory_mib,
                    "since_generation": row.since_generation,
                    "driver": row.driver,
                }
                for m, row in present
            ],
        )
    bookings = [
        {"machine_id": m, "gpu_uuid": uuid, "workload_id": row.workload_id}
        for m, row in present
        for uuid in row.gpus
    ]
    if bookings:
        execute(conn, _INSERT_BOOKING, bookings)


def _machine(r: Any) -> Machine:
    return Machine(
        machine_id=r.machine_id,
        region=r.region,
        inventory=Inventory.from_bytes(r.inventory),
        generation=r.generation,
        liveness=Liveness(r.liveness),
    )


def _row(r: Any) -> Row:
    return Row(
        workload_id=r.workload_id,
        target=Target(r.target),
        gpus=list(json.loads(r.gpus)),
        cpus=float(r.cpus),
        memory_mib=int(r.memory_mib),
        since_generation=r.since_generation,
        driver=r.driver,
    )


def _workload(r: Any) -> Workload:
    return Workload(
        workload_id=r.workload_id,
        tenant_id=r.tenant_id,
        user_id=r.user_id,
        region=r.region,
        kind=WorkloadKind(r.kind),
        name=r.name,
        class_name=r.class_name,
        count=r.count,
        spec=json.loads(r.spec),
        state=WorkloadState(r.state),
        access_token="",  # derived, never stored: the engine fills it in (tokens.py)
        created_at=r.created_at,
        reason=r.reason,
        machine_id=r.machine_id,
        seq=r.seq,
        pending_since=r.pending_since,
        request_id=r.request_id,
        placed_class=r.placed_class,
        chain=Chain.from_json(r.fallback) if r.fallback else None,
    )


def _chunks(items: Iterable[str], size: int = 500) -> list[list[str]]:
    listed = list(items)
    return [listed[i : i + size] for i in range(0, len(listed), size)]
