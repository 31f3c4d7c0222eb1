"""A standby takes the term even when the deposed leader froze holding the lease row's lock in
an active statement, where Postgres's idle-in-transaction timeout does not reach.

CI once saw a leader SIGSTOPped in the middle of a commit keep the row for as long as it stayed
frozen (30 s): every standby's take timed out, and the region had no leader. Here a real
Postgres session holds the row and stays busy in a statement, as that frozen one did.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from einsora.scheduler.store import SchedulerStore

pytestmark = [pytest.mark.postgres]


async def test_a_frozen_holder_of_the_lease_row_is_ended_and_the_term_taken(
    postgres_url: str,
) -> None:
    store = SchedulerStore(postgres_url, lease_s=1.0)
    await store.migrate()
    assert await store.take_term("local", 1, "scheduler-old")
    dsn = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    frozen = await asyncpg.connect(dsn)
    try:
        transaction = frozen.transaction()
        await transaction.start()
        await frozen.execute("SELECT term FROM scheduler_leases WHERE region = 'local' FOR UPDATE")
        # Busy, not idle: the idle-in-transaction timeout never ends this session. The row's
        # lock is held already (the FOR UPDATE above returned), so no wait is needed here.
        sleeping = asyncio.ensure_future(frozen.execute("SELECT pg_sleep(60)"))
        taken = await asyncio.wait_for(store.take_term("local", 2, "scheduler-new"), 20)
        assert taken
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
            await asyncio.wait_for(sleeping, 10)  # its session was ended: it is told so
        assert not await store.take_term("local", 2, "scheduler-old")  # the new term stands
    finally:
        frozen.terminate()
        await store.close()
