"""A background loop stops when its service cancels it, even when the cancel was swallowed.

Python 3.11's `wait_for` (under every nats-py request and JetStream publish) returns the result
and drops a cancel that arrives as the result does, and nats-py turns some cancelled requests
into its own TimeoutError. The task is left `cancelling()` with nothing pending: a loop that
goes on never ends and its service's stop() hangs (a scheduler renewing its lease hung a test's
teardown so). `raise_if_cancelled()` at the top of each turn ends it."""

from __future__ import annotations

import asyncio

from einsora.common.runloop import raise_if_cancelled


async def _answered_as_cancelled(swallowed: list[bool]) -> None:
    """A request whose answer and cancel arrive together, as 3.11's wait_for settles it: the
    answer wins and the cancel is dropped (the first time; a later cancel goes through)."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        if swallowed:
            raise
        swallowed.append(True)


async def _renewing(asking: asyncio.Event, *, checks: bool) -> None:
    swallowed: list[bool] = []
    while True:
        if checks:
            raise_if_cancelled()
        asking.set()
        await _answered_as_cancelled(swallowed)
        await asyncio.sleep(0.01)


async def _cancelled_mid_request(*, checks: bool) -> asyncio.Task[None]:
    asking = asyncio.Event()
    task = asyncio.create_task(_renewing(asking, checks=checks))
    await asking.wait()
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    return task


async def test_a_loop_that_checks_ends_when_its_cancel_was_swallowed() -> None:
    task = await _cancelled_mid_request(checks=True)
    assert task.done()
    assert task.cancelled()


async def test_without_the_check_the_loop_runs_on() -> None:
    """Why the check exists: the same loop without it is still running after its cancel."""
    task = await _cancelled_mid_request(checks=False)
    assert not task.done()
    task.cancel()  # not swallowed this time
    await asyncio.wait({task}, timeout=1)
    assert task.cancelled()
