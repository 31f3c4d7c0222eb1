"""The order of a pool's queue, and who is ahead of whom (ADR-0003, ADR-0014, ADR-0030).

A GPU pool is ordered by each tenant's decayed recent GPU use (least first), then age; the CPU
pool, and any pool while no tenant has recent use, by age alone. A queued workload **holds**
its usable machines (`filters/usable.py`) at each of its targets in the pool that its quota lets
it start at, unless a `replicas` step made it optional: those are the machines it waits for,
which no workload behind it may take. "How many are ahead" counts the workloads ahead of it in
this order that hold a machine it could use too, and no others.

Counting works on the queue's groups (`queue.py`), never on its members one by one: a group's
members share their tenant, so where a workload stands against a whole group is one
comparison, or a bisection; a deep queue costs no more to count than a shallow one.
"""

from __future__ import annotations

from einsora.scheduler import fallback
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import CPU_POOL
from einsora.scheduler.filters import quota, usable
from einsora.scheduler.model import Workload
from einsora.scheduler.queue import Group

Rank = tuple[object, ...]


def recent_use(book: Book, tenant_id: str) -> float:
    """The tenant's decayed recent GPU-hours (fair share's U; 0 with none reported)."""
    usage = book.usage.get(tenant_id)
    return usage.decayed_gpu_hours if usage is not None else 0.0


def fair(book: Book, pool: str) -> bool:
    """Whether the pool is ordered by fair share (else by age alone)."""
    return pool != CPU_POOL and bool(book.usage)


def rank(book: Book, workload: Workload, by_use: bool) -> Rank:
    """Where `workload` stands in its pool's order (smaller first)."""
    if by_use:
        return (recent_use(book, workload.tenant_id), *workload.queue_key)
    return workload.queue_key


def group_rank(book: Book, group: Group, by_use: bool) -> Rank:
    """Where the group's oldest member stands in its pool's order."""
    if by_use:
        return (recent_use(book, group.tenant_id), *group.ages[0])
    return group.ages[0]


def holding(book: Book, workload: Workload, pool: str) -> frozenset[str]:
    """The machines of `pool` that `workload`, waiting, holds back from those behind it."""
    chain = workload.chain
    if chain is not None and chain.optional:
        return frozenset()
    held: frozenset[str] = frozenset()
    for target in fallback.targets_here(book, workload):
        demand = fallback.demand_for(book, workload, target)
        if demand is None or demand.pool != pool:
            continue
        if quota.refusal(book, workload, demand) is None:
            held |= usable.machines(book, workload, demand, target.machine)
    return held


def held_ahead(book: Book, workload: Workload, pool: str) -> frozenset[str]:
    """The machines of `pool` held by the workloads ahead of `workload` there."""
    queue = book.queue.get(pool)
    if queue is None:
        return frozenset()
    by_use = fair(book, pool)
    mine = rank(book, workload, by_use)
    held: set[str] = set()
    for group in queue.groups.values():
        if group.head is not workload and group_rank(book, group, by_use) < mine:
            held |= holding(book, group.head, pool)
    return frozenset(held)


def wanted_by_others(book: Book, workload: Workload, pool: str) -> frozenset[str]:
    """The machines of `pool` some other workload waiting there holds (where a replica made
    optional by a `replicas` step gives way)."""
    queue = book.queue.get(pool)
    if queue is None:
        return frozenset()
    wanted: set[str] = set()
    for group in queue.groups.values():
        head = group.head if group.head is not workload else None
        if head is None and len(group.members) > 1:
            head = group.members[1]
        if head is not None:
            wanted |= holding(book, head, pool)
    return frozenset(wanted)


def ahead(book: Book, workload: Workload, pool: str, wants: frozenset[str]) -> int:
    """How many workloads ahead of `workload` in `pool` hold a machine of `wants` (the machines
    it may use there): the ones that go before it. What each group holds is what the last
    pass over the pool found (`Group.holds`): "ahead" is said right after one."""
    queue = book.queue.get(pool)
    if queue is None:
        return 0
    by_use = fair(book, pool)
    mine = rank(book, workload, by_use)
    count = 0
    for group in queue.groups.values():
        if not group.holds.isdisjoint(wants):
            count += _before(book, group, mine, by_use)
    return count


def _before(book: Book, group: Group, mine: Rank, by_use: bool) -> int:
    """How many of the group's members rank before `mine` (they share a tenant, so its recent
    use settles it for all of them, or else their age does)."""
    if not by_use:
        return group.count_before(mine)
    use = recent_use(book, group.tenant_id)
    if use != mine[0]:
        return len(group.members) if use < mine[0] else 0  # type: ignore[operator]
    return group.count_before(mine[1:])
