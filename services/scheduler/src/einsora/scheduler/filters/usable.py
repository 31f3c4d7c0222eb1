"""A workload's usable machines at one target: those that pass every lasting filter (region,
health, class and lend, trust), whether or not they are reporting or have room now.

A workload waits for its usable machines, and while it waits it holds them back from the
workloads behind it in its pool (ADR-0030). Sets are cached in the book by what decides them
(the demand, the tenant and user, what picks the driver, a pinned machine) and dropped when any
machine changes (`Book.machine_changed`), so a pass over a deep queue computes each once.
"""

from __future__ import annotations

from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand, holds_emptied
from einsora.scheduler.drivers import needs_key
from einsora.scheduler.filters import health, lend, region, trust
from einsora.scheduler.model import Machine, Workload


def machines(
    book: Book, workload: Workload, demand: Demand, pinned: str | None = None
) -> frozenset[str]:
    """The ids of the machines `workload` may use for `demand` (only `pinned`, when a
    fallback step pins one)."""
    key = ("usable", demand, workload.tenant_id, workload.user_id, needs_key(workload), pinned)
    found = book.derived.get(key)
    if found is None:
        candidates = book.machines.values() if pinned is None else _one(book, pinned)
        found = frozenset(
            m.machine_id for m in candidates if passes_lasting(book, m, workload, demand)
        )
        book.derived[key] = found
    assert isinstance(found, frozenset)
    return found


def passes_lasting(book: Book, machine: Machine, workload: Workload, demand: Demand) -> bool:
    return (
        region.lasting(machine)
        and health.passes(machine, demand)
        and lend.passes(machine, demand)
        and trust.passes(book, machine, workload)
    )


def fits_anywhere(book: Book, demand: Demand) -> bool:
    """Whether some enrolled machine of the region, emptied, would hold `demand` with all of its
    inventory, whoever may use it and whatever its owner lends (for saying why one waits)."""
    key = ("anywhere", demand)
    found = book.derived.get(key)
    if found is None:
        found = any(
            region.lasting(m) and holds_emptied(m, demand, lent=False)
            for m in book.machines.values()
        )
        book.derived[key] = found
    assert isinstance(found, bool)
    return found


def _one(book: Book, machine_id: str) -> list[Machine]:
    machine = book.machines.get(machine_id)
    return [] if machine is None else [machine]
