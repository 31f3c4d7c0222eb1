"""Allocations as rows of `accounting_allocations` and back, and the statements that store
them: metering in order (metering.py) and late events (late.py) write them the same way."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from einsora.accounting import tables as t
from einsora.accounting.model import Allocation


def allocation_values(a: Allocation) -> dict[str, Any]:
    """An allocation as a row of `accounting_allocations` (without its id)."""
    return {
        "workload_id": a.workload_id,
        "tenant_id": a.tenant_id,
        "kind": a.kind,
        "class_name": a.class_name,
        "placed_class": a.placed_class,
        "region": a.region,
        "machine": a.machine,
        "gpu_count": a.gpu_count,
        "gpus": json.dumps(a.gpus),
        "cpus": a.cpus,
        "memory_mib": a.memory_mib,
        "started_at": a.started_at,
        "ended_at": a.ended_at,
        "opened_by_event": a.opened_by_event,
        "closed_by_event": a.closed_by_event,
        "opened_seq": a.opened_seq,
        "closed_seq": a.closed_seq,
    }


def allocation_of(r: Any) -> Allocation:
    """An `accounting_allocations` row as an Allocation."""
    return Allocation(
        id=int(r.id),
        workload_id=r.workload_id,
        tenant_id=r.tenant_id,
        kind=r.kind,
        class_name=r.class_name,
        placed_class=r.placed_class,
        region=r.region,
        machine=r.machine,
        gpus=list(json.loads(r.gpus)),
        cpus=float(r.cpus),
        memory_mib=int(r.memory_mib),
        started_at=r.started_at,
        ended_at=r.ended_at,
        opened_by_event=r.opened_by_event,
        closed_by_event=r.closed_by_event,
        opened_seq=None if r.opened_seq is None else int(r.opened_seq),
        closed_seq=None if r.closed_seq is None else int(r.closed_seq),
    )


def insert_allocations(conn: sa.Connection, allocations: Sequence[Allocation]) -> None:
    """Insert allocations (open, or already closed), setting each one's id."""
    if not allocations:
        return
    ids = conn.execute(
        t.allocations.insert().returning(t.allocations.c.id, sort_by_parameter_order=True),
        [allocation_values(a) for a in allocations],
    ).scalars()
    for a, allocation_id in zip(allocations, ids, strict=True):
        a.id = int(allocation_id)


def store_ends(conn: sa.Connection, allocations: Sequence[Allocation], *, open_only: bool) -> None:
    """Write these stored allocations' ends (time, event, `seq`). `open_only`: each must still
    be open in the store (a close); otherwise an end moved by a late event is rewritten."""
    if not allocations:
        return
    stmt = _CLOSE if open_only else _MOVE_END
    result = conn.execute(
        stmt,
        [
            {
                "b_id": a.id,
                "b_ended_at": a.ended_at,
                "b_closed_by": a.closed_by_event,
                "b_closed_seq": a.closed_seq,
            }
            for a in allocations
        ],
    )
    if conn.dialect.supports_sane_multi_rowcount and result.rowcount != len(allocations):
        # The workload rows are locked, so only a bug gets here; the batch is retried.
        raise RuntimeError("an allocation to close was no longer there to close")


def rewrite(conn: sa.Connection, allocation: Allocation) -> None:
    """Write a stored allocation's every field (a late event moved its start)."""
    values = {f"b_{k}": v for k, v in allocation_values(allocation).items()}
    result = conn.execute(_REWRITE, {"b_id": allocation.id, **values})
    if result.rowcount != 1:
        raise RuntimeError("an allocation to rewrite was no longer there")


_REWRITE = (
    t.allocations.update()
    .where(t.allocations.c.id == sa.bindparam("b_id"))
    .values({c.name: sa.bindparam(f"b_{c.name}") for c in t.allocations.c if c.name != "id"})
)
_MOVE_END = (
    t.allocations.update()
    .where(t.allocations.c.id == sa.bindparam("b_id"))
    .values(
        ended_at=sa.bindparam("b_ended_at"),
        closed_by_event=sa.bindparam("b_closed_by"),
        closed_seq=sa.bindparam("b_closed_seq"),
    )
)
_CLOSE = _MOVE_END.where(t.allocations.c.ended_at.is_(None))
