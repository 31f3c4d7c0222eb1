"""What the api knows of each region's scheduler: alive or not, and its free capacity.

Each region's scheduler puts `regions/<region>` every few seconds (ADR-0022); the api mirrors
the bucket with a `KvMirror` and keeps the latest status of each region in memory for
`GET /v1/regions`, and to say on a launch's timeline when its region's scheduler is down (the
launch is accepted and stays `pending` until that scheduler is back and takes its intent).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import ValidationError

from einsora.common.bus import KvMirror, names
from einsora.common.schemas import RegionStatus, utcnow, what_is_wrong

log = logging.getLogger("einsora.api.views.regions")

AUDIT_S = 60.0


class RegionsView:
    """The regions' schedulers, as they last said, kept current by a KV mirror."""

    def __init__(self) -> None:
        self._statuses: dict[str, RegionStatus] = {}
        self._mirror: KvMirror | None = None

    def status(self, region: str) -> RegionStatus | None:
        return self._statuses.get(region)

    def snapshot(self) -> dict[str, RegionStatus]:
        return dict(self._statuses)

    def why_down(self, region: str, now: datetime | None = None) -> str | None:
        """Why a launch in `region` waits for its scheduler (None: it is up, or no scheduler
        of the region ever reported, which an api started before its schedulers cannot tell
        from one that is down)."""
        status = self._statuses.get(region)
        if status is None:
            return None
        why = status.why_down(now or utcnow())
        if why is None:
            return None
        return f"{why}; it stays pending until that scheduler is back, which takes it then"

    async def start(self, nc: NATS, js: JetStreamContext, *, sync_timeout_s: float = 5.0) -> None:
        self._mirror = KvMirror(
            nc,
            js,
            names.REGIONS,
            on_put=self.apply,
            on_delete=lambda key: self.apply(key, None),
            audit_s=AUDIT_S,
        )
        with contextlib.suppress(TimeoutError):
            await self._mirror.start(sync_timeout_s=sync_timeout_s)

    async def stop(self) -> None:
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            await mirror.stop()

    def apply(self, key: str, value: bytes | None) -> None:
        """Take one region's status (None: deleted) into the view."""
        if value is None:
            self._statuses.pop(key, None)
            return
        try:
            status = RegionStatus.from_bytes(value)
        except ValidationError as exc:
            log.warning(
                "unreadable region status skipped",
                extra={"key": key, "error": what_is_wrong(exc)},
            )
            return
        if status.region == key:
            self._statuses[key] = status
