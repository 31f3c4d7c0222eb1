"""The queue of one pool, filed by what its workloads may use: state, no decisions.

Workloads queue in the pool of the capacity they compete for (a GPU class, or all CPU classes
together: `capacity.CPU_POOL`). Within a pool they are filed in **groups**: workloads of one
tenant and user that ask for the same class, count, runtime and kind of driver may use exactly
the same machines and are held by the same quota, so admission decides a group by its oldest
member (ADR-0030). A workload with a fallback chain is a group of its own: its targets are its
own.

Each group keeps its members oldest first (`Workload.queue_key`), inserted and removed by
bisection, so neither a deep queue nor a placement copies or scans it; each workload knows its
group, so removing one never searches the pool. The order between groups (fair share, age) is
`order.py`'s: the queue only keeps them.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from einsora.scheduler.capacity import runtime_needed
from einsora.scheduler.drivers import needs_key
from einsora.scheduler.model import Workload


def group_key(workload: Workload) -> Hashable:
    """What decides where a queued workload may go and whether its quota holds it: workloads
    with one key are interchangeable to admission but for their age."""
    if workload.chain is not None:
        return ("chain", workload.workload_id)
    return (
        workload.tenant_id,
        workload.user_id,
        workload.class_name,
        workload.count,
        runtime_needed(workload),
        needs_key(workload),
    )


@dataclass(eq=False)
class Group:
    """Queued workloads of one pool that may use the same machines, oldest first."""

    key: Hashable
    tenant_id: str
    members: list[Workload] = field(default_factory=list)
    ages: list[tuple[datetime, str]] = field(default_factory=list)
    """Each member's `queue_key` as it was queued, in the same order (bisected directly)."""
    holds: frozenset[str] = frozenset()
    """The machines its oldest member held at the last pass over the pool (admission.py):
    what "how many are ahead" counts against, without asking the filters again."""
    said: str | None = None
    """The last reason admission gave the whole group (a quota, or no machine that would ever
    hold it): its members' timelines are told again only when it changes."""

    @property
    def head(self) -> Workload:
        return self.members[0]

    def add(self, workload: Workload) -> tuple[datetime, str]:
        """File it by its age; returns the age it is filed by."""
        age = workload.queue_key
        i = bisect.bisect_right(self.ages, age)
        self.ages.insert(i, age)
        self.members.insert(i, workload)
        return age

    def remove(self, workload: Workload, age: tuple[datetime, str]) -> None:
        i = bisect.bisect_left(self.ages, age)
        if i >= len(self.members) or self.members[i] is not workload:
            i = self.members.index(workload)
        del self.ages[i]
        del self.members[i]

    def count_before(self, age: tuple[object, ...]) -> int:
        """How many members are older than `age` (a `queue_key`)."""
        return bisect.bisect_left(self.ages, age)


class PoolQueue:
    """One pool's queued workloads, in groups."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.groups: dict[Hashable, Group] = {}
        self._group_of: dict[str, tuple[Group, tuple[datetime, str]]] = {}
        self._length = 0

    def add(self, workload: Workload) -> None:
        if workload.workload_id in self._group_of:
            return
        key = group_key(workload)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(key, workload.tenant_id)
        self._group_of[workload.workload_id] = (group, group.add(workload))
        self._length += 1

    def remove(self, workload: Workload) -> bool:
        """Take it out; whether it was here."""
        found = self._group_of.pop(workload.workload_id, None)
        if found is None:
            return False
        group, age = found
        group.remove(workload, age)
        if not group.members:
            del self.groups[group.key]
        self._length -= 1
        return True

    def group_of(self, workload: Workload) -> Group | None:
        found = self._group_of.get(workload.workload_id)
        return None if found is None else found[0]

    def __contains__(self, workload: object) -> bool:
        return isinstance(workload, Workload) and workload.workload_id in self._group_of

    def __len__(self) -> int:
        return self._length

    def __bool__(self) -> bool:
        return self._length > 0

    def __iter__(self) -> Iterator[Workload]:
        """Every queued workload, oldest first (for counts and listings, not for admission)."""
        merged = heapq.merge(*(zip(g.ages, g.members, strict=True) for g in self.groups.values()))
        return (workload for _, workload in merged)
