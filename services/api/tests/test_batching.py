"""Group commit on both engines: concurrent inserts share transactions, and one request's bad
row fails that request alone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from einsora.api import models
from einsora.api.store import Store


async def test_concurrent_inserts_share_commits_and_a_bad_one_fails_alone(store_url: str) -> None:
    store = Store(store_url)
    now = datetime.now(UTC)
    try:
        await store.migrate()

        async def tenant(i: int) -> None:
            row = {"id": f"t-{i}", "name": f"n{i}", "created_at": now}
            await store.inserts.insert([(models.tenants, row)])

        async def orphan() -> None:  # a member of a tenant and user that do not exist
            row = {"tenant_id": "t-none", "user_id": "u-none", "role": "member", "created_at": now}
            await store.inserts.insert([(models.members, row)])

        results = await asyncio.gather(
            *(tenant(i) for i in range(20)),
            orphan(),
            *(tenant(i) for i in range(20, 40)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1
        assert isinstance(errors[0], IntegrityError)
        async with store.read() as conn:
            count = await conn.scalar(sa.select(sa.func.count()).select_from(models.tenants))
        assert count == 40
        # 41 requests in far fewer transactions (the failed batch is retried one by one).
        assert store.inserts.batches < 41
        with pytest.raises(IntegrityError):
            await tenant(0)  # a duplicate alone
    finally:
        await store.close()
