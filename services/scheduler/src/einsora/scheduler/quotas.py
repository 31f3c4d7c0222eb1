"""Tenants' quotas and recent use, read from the `usage` bucket into the book.

The operator sets a tenant's quota through the api (`usage/quota.<tenant>`); accounting
publishes its recent use (`usage/tenant.<tenant>`). Devices in use now are counted from the book
itself (what this scheduler has placed), so two launches in one cycle cannot both take the last
device of a quota; GPU-hours of the last 7 days come from accounting. A workload past a quota
stays queued with a note a person can act on, does not hold up other tenants' workloads behind
it, and is admitted as soon as its tenant's use drops: the filter is `filters/quota.py`.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from einsora.common.bus import names
from einsora.common.schemas import TenantQuota, TenantUsage, what_is_wrong
from einsora.scheduler.book import Book

log = logging.getLogger("einsora.scheduler.quotas")

_QUOTA = names.tenant_quota_key("x").removesuffix("x")
_USAGE = names.tenant_usage_key("x").removesuffix("x")


def apply_usage_key(book: Book, key: str, value: bytes | None) -> bool:
    """A key of the `usage` bucket changed (None: deleted); whether admission may now go
    further: a quota changed, or a tenant's recent use did while workloads wait (fair share
    may now put one ahead that has room where those before it had none: ADR-0030)."""
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
            return tenant in book.quotas or bool(book.queue)
    except ValidationError as exc:
        why = what_is_wrong(exc)
        log.warning("unreadable usage value ignored", extra={"key": key, "error": why})
    return False
