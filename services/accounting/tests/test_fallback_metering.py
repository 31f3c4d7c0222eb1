"""A workload placed by its fallback chain is metered as the class it was placed as, not the
one it asked for (ADR-0022): the allocation keeps both, and reports group by the placed one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from einsora.accounting.testing import T0, SchedulerPlayer, events_done, held, hours
from einsora.common.ids import new_id
from einsora.common.schemas import WorkloadState
from einsora.common.testing import Bus

if TYPE_CHECKING:
    from services.accounting.tests.conftest import StartAccounting

S = WorkloadState


async def test_a_fallback_is_metered_as_the_class_it_was_placed_as(
    bus: Bus, scheduler: SchedulerPlayer, start_accounting: StartAccounting, sqlite_url: str
) -> None:
    accounting = await start_accounting(sqlite_url)
    w = new_id("workload")
    # Asked for an l40s-48gb; its chain placed it on an a100-80gb.
    what = held(1, placed_class="a100-80gb").model_copy(update={"class_name": "l40s-48gb"})
    await scheduler.transition(w, S.scheduled, T0 - hours(1), tenant_id="t-fb", metered=what)
    await scheduler.transition(w, S.running, T0, tenant_id="t-fb", metered=what)
    await scheduler.transition(w, S.parking, T0 + hours(2), tenant_id="t-fb", metered=what)
    await events_done(bus.js)
    [allocation] = await accounting.store.allocations(workload_id=w)
    assert (allocation.class_name, allocation.placed_class) == ("l40s-48gb", "a100-80gb")
    assert allocation.seconds(T0) == 2 * 3600
