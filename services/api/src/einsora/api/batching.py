"""Group commit: the inserts of many concurrent requests in one transaction.

On SQLite one transaction commits at a time, and each statement is a hop to the driver's
thread, so a launch's own transaction (begin, three inserts, commit) caps the rate at a few
hundred per second however many clients wait. Requests whose change is inserts only (a launch
without an Idempotency-Key) hand their rows to this batcher instead: one writer task takes every
request waiting, inserts each table's rows with one executemany, commits once, and only then
answers them all. A batch that fails is retried request by request, so one bad request never
fails another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

if TYPE_CHECKING:
    from einsora.api.store import Store

log = logging.getLogger("einsora.api.batching")

Rows = Sequence[tuple[sa.Table, dict[str, Any]]]
"""One request's inserts, in dependency order (a workload before its timeline entry)."""


class InsertBatcher:
    """Commits the inserts of concurrent requests together; each call returns after the commit."""

    def __init__(self, store: Store, *, max_requests: int = 256) -> None:
        self._store = store
        self._max = max_requests
        self._queue: list[tuple[Rows, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.batches = 0
        """Transactions committed so far (for tests and benchmarks)."""

    async def insert(self, rows: Rows) -> None:
        """Insert `rows` in one transaction with whatever else is waiting; raises its error."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((rows, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="insert batcher")
        self._wake.set()
        await future

    async def close(self) -> None:
        """Finish what is queued, then stop."""
        task, self._task = self._task, None
        if task is None:
            return
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(task, 30)
        except TimeoutError:
            log.warning("insert batcher did not finish in time")
        finally:
            self._closing = False

    async def _run(self) -> None:
        while True:
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                await self._commit(batch)
            if self._closing:
                return
            await self._wake.wait()
            self._wake.clear()

    async def _commit(self, batch: list[tuple[Rows, asyncio.Future[None]]]) -> None:
        try:
            async with self._store.write() as conn:
                await _insert_all(conn, [rows for rows, _ in batch])
        except SQLAlchemyError as exc:
            if len(batch) == 1:
                _settle(batch, exc)
                return
            log.info("batch refused; retrying its requests one by one", extra={"error": str(exc)})
            for item in batch:
                await self._commit([item])
            return
        except BaseException as exc:
            _settle(batch, exc if isinstance(exc, Exception) else RuntimeError("stopped"))
            raise
        self.batches += 1
        _settle(batch, None)


def _settle(batch: list[tuple[Rows, asyncio.Future[None]]], error: Exception | None) -> None:
    for _, future in batch:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


async def _insert_all(conn: AsyncConnection, requests: list[Rows]) -> None:
    by_table: dict[sa.Table, list[dict[str, Any]]] = {}
    for rows in requests:
        for table, row in rows:
            by_table.setdefault(table, []).append(row)
    # Tables in the order they first appear, so foreign keys point at rows already inserted.
    for table, table_rows in by_table.items():
        await conn.execute(sa.insert(table), table_rows)
