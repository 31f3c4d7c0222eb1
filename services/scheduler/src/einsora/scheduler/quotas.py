"""Tenants' quotas at admission: a workload is never placed past its tenant's quota.

The operator sets a tenant's quota through the api (`usage/quota.<tenant>`); accounting
publishes its recent use (`usage/tenant.<tenant>`). Devices in use now are counted from the book
itself (what this scheduler has placed), so two launches in one cycle cannot both take the last
device of a quota; GPU-hours of the last 7 days come from accounting. A workload past a quota
stays queued with a note a person can act on, does not hold up other tenants' workloads behind
it, and is admitted as soon as its tenant's use drops.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from einsora.common.bus import names
from einsora.common.schemas import TenantQuota, TenantUsage, what_is_wrong
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import Demand
from einsora.scheduler.model import Workload

log = logging.getLogger("einsora.scheduler.quotas")

_QUOTA = names.tenant_quota_key("x").removesuffix("x")
_USAGE = names.tenant_usage_key("x").removesuffix("x")


def apply_usage_key(book: Book, key: str, value: bytes | None) -> bool:
    """A key of the `usage` bucket changed (None: deleted); whether a quota may now admit more."""
    try:
        if key.startswith(_QUOTA):
            tenant = key.removeprefix(_QUOTA)
            if value is None:
                return book.quotas.pop(tenant, None) is not None
            book.quotas[tenant] = TenantQuota.from_bytes(value)
            return True
        if key.startswith(_USAGE):
            tenant = key.removeprefix(_USAGE)
            if value is None:
                book.usage.pop(tenant, None)
            else:
                book.usage[tenant] = TenantUsage.from_bytes(value)
            return tenant in book.quotas
    except ValidationError as exc:
        why = what_is_wrong(exc)
        log.warning("unreadable usage value ignored", extra={"key": key, "error": why})
    return False


def refusal(book: Book, workload: Workload, demand: Demand) -> str | None:
    """Why the tenant's quota does not let `workload` start now, or None."""
    quota = book.quotas.get(workload.tenant_id)
    if quota is None or not demand.gpu:
        return None
    used = book.gpus_in_use(workload.tenant_id)
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
