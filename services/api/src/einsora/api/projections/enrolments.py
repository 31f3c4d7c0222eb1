"""The `enrolments` bucket holds every enrolled machine's record from the store.

The routes write it as they go: a machine that joins is put before its credential is returned,
a revocation before the DELETE answers. A pass (kv.py) repairs the rest. A revocation is final:
a pass never puts a record that is not revoked over one that is. A pass that read the store just
before a revocation committed cannot undo it, and its conditional write would be refused anyway
(only the api writes the bucket).
"""

from __future__ import annotations

import logging

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from einsora.api.projections.kv import KvProjection, ProjectionSync
from einsora.api.services.machines import enrolments
from einsora.api.store import Store
from einsora.api.views.machines import MachinesView
from einsora.common.bus import names
from einsora.common.failures import log_failure, outlives
from einsora.common.schemas import Enrolment

log = logging.getLogger("einsora.api.enrolments")

SYNC_PERIOD_S = 60.0


def _revocation_stands(have: Enrolment, want: Enrolment) -> bool:
    return have.revoked and not want.revoked


class EnrolmentsSync(ProjectionSync):
    """Puts enrolments into KV for the routes, and repairs the bucket (see the module)."""

    def __init__(
        self,
        store: Store,
        nc: NATS,
        js: JetStreamContext,
        *,
        period_s: float = SYNC_PERIOD_S,
        view: MachinesView | None = None,
    ) -> None:
        self._view = view

        async def rows() -> dict[str, Enrolment]:
            return await enrolments(store)

        super().__init__(
            KvProjection(
                nc,
                js,
                names.ENROLMENTS,
                what="enrolments sync",
                record=Enrolment,
                key_of=names.enrolment_key,
                rows=rows,
                period_s=period_s,
                stays=_revocation_stands,
            ),
            first_now=True,
        )

    async def put(self, enrolment: Enrolment) -> None:
        """Write one record now; a failure is left to the next pass (asked for at once)."""
        try:
            await self.projection.put(enrolment.machine_id, enrolment)
        except Exception as exc:
            if not outlives(exc, nats.errors.Error):
                raise
            log_failure(
                log,
                "an enrolment did not reach the bus; the sync will put it",
                exc,
                {"machine_id": enrolment.machine_id},
            )
            self.projection.wanted()
            return
        if self._view is not None:
            # Read your writes: this api's next answer shows it, before its own watch of the
            # bucket brings the same value back (which then changes nothing).
            self._view.apply_enrolment(enrolment.machine_id, enrolment.to_bytes())
