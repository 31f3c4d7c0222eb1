"""Regions and their schedulers, as one region's scheduler sees them (ADR-0022).

Each region has its own scheduler (a cell): it consumes only `intent.<region>.>` and owns only
its region's machines. It tells the others it is alive, and what it has free, by putting its
`RegionStatus` every few seconds (`beacon.py`), and reads theirs into `Book.regions`, so a
region step goes only to a region whose scheduler is up. Liveness is judged on the wall clock
(the heartbeat's own time), never on the book's test clock: it is about real silence.

Plain functions over the book; the I/O is the beacon's and the engine's.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from einsora.common.catalog import Accelerator
from einsora.common.schemas import RegionStatus, utcnow, what_is_wrong
from einsora.scheduler import reasons
from einsora.scheduler.book import Book
from einsora.scheduler.capacity import free_cpus, free_memory_mib

log = logging.getLogger("einsora.scheduler.regions")


def is_up(book: Book, region: str) -> bool:
    """Whether `region`'s scheduler said it is up, and recently enough."""
    status = book.regions.get(region)
    return status is not None and status.down_since(utcnow()) is None


def why_down(book: Book, region: str) -> str:
    """The clause for a region step to a region whose scheduler is down."""
    status = book.regions.get(region)
    if status is None:
        return reasons.region_never_heard(region)
    return status.why_down(utcnow()) or f"region {region}'s scheduler is up"


def apply_status(book: Book, region: str, value: bytes | None) -> bool:
    """Another region's status changed (None: deleted); whether its scheduler came up."""
    if region == book.region:
        return False
    was_up = is_up(book, region)
    if value is None:
        book.regions.pop(region, None)
        return False
    try:
        status = RegionStatus.from_bytes(value)
    except ValidationError as exc:
        log.warning(
            "unreadable region status ignored",
            extra={"region": region, "error": what_is_wrong(exc)},
        )
        return False
    if status.region != region:
        log.warning("a region status names another region than its key; ignored")
        return False
    book.regions[region] = status
    return not was_up and is_up(book, region)


def summary(book: Book, period_s: float) -> RegionStatus:
    """This region's status now: its machines that take work, what is free, what waits."""
    placeable = [m for m in book.machines.values() if m.placeable]
    free: dict[str, int] = {}
    for machine_class in book.catalog:
        name = machine_class.name
        if machine_class.accelerator is Accelerator.cpu:
            fits = 0
            for m in placeable:
                cpus = int(free_cpus(m) // machine_class.cpus) if machine_class.cpus else 0
                memory = int(free_memory_mib(m) // machine_class.memory_mib)
                fits += max(0, min(cpus, memory))
            count = fits
        else:
            count = sum(book.index.free_devices(m.machine_id, name) for m in placeable)
        if count:
            free[name] = count
    queued = {w.workload_id for queue in book.queue.values() for w in queue}
    return RegionStatus(
        region=book.region,
        at=utcnow(),
        period_s=period_s,
        machines=len(placeable),
        free=free,
        queued=len(queued),
    )
