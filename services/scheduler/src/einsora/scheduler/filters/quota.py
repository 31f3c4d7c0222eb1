"""Filter 5, quota: does the tenant's quota let the workload start now? A question of the
workload, not of a machine: a workload its quota holds waits, and holds back nothing.

The operator sets a tenant's quota through the api (`usage/quota.<tenant>`); accounting
publishes its recent use (`usage/tenant.<tenant>`: `quotas.py` reads both into the book).
Devices in use now are counted from the book itself (what this scheduler has placed), so two
launches in one cycle cannot both take the last device of a quota; GPU-hours of the last 7 days
come from accounting.
"""

from __future__ import annotations

from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand
from einsora.scheduler.model import Workload

QUESTION = "Does the tenant's quota let it start now?"


def gpus_in_use(book: Book, tenant_id: str) -> dict[str, int]:
    """Devices booked for the tenant's workloads now, by class."""
    used: dict[str, int] = {}
    for machine in book.machines.values():
        for row in machine.rows.values():
            if row.gpus:
                workload = book.workloads.get(row.workload_id)
                if workload is not None and workload.tenant_id == tenant_id:
                    placed = workload.placed_class or workload.class_name
                    used[placed] = used.get(placed, 0) + len(row.gpus)
    return used


def refusal(book: Book, workload: Workload, demand: Demand) -> str | None:
    """Why the tenant's quota does not let `workload` start now, or None."""
    quota = book.quotas.get(workload.tenant_id)
    if quota is None or not demand.gpu:
        return None
    used = gpus_in_use(book, workload.tenant_id)
    cap = quota.max_gpus.get(demand.class_name)
    if cap is not None and used.get(demand.class_name, 0) + demand.count > cap:
        return (
            f"quota: {used.get(demand.class_name, 0)} of {cap} {demand.class_name} in use by "
            f"your tenant; it starts when {_enough(used.get(demand.class_name, 0), cap, demand)} "
            "released (or the operator raises the quota)"
        )
    total = sum(used.values())
    if quota.max_gpus_total is not None and total + demand.count > quota.max_gpus_total:
        return (
            f"quota: {total} of {quota.max_gpus_total} GPUs in use by your tenant; it starts "
            f"when {_enough(total, quota.max_gpus_total, demand)} released (or the operator "
            "raises the quota)"
        )
    usage = book.usage.get(workload.tenant_id)
    hours = quota.gpu_hours_per_7d
    if hours is not None and usage is not None and usage.gpu_hours_7d >= hours:
        return (
            f"quota: your tenant used {usage.gpu_hours_7d:.1f} of {hours:g} GPU-hours in the "
            "last 7 days; it starts when its use of the last 7 days drops below that (or the "
            "operator raises the quota)"
        )
    return None


def _enough(used: int, cap: int, demand: Demand) -> str:
    short = used + demand.count - cap
    return "one is" if short == 1 else f"{short} are"
