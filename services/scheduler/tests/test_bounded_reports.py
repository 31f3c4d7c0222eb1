"""What a machine says of itself is bounded (issue 34, N7): an inventory over its limits is
refused in one log line, and a machine rewriting its keys in a loop is read at a bounded pace,
the latest kept, while a first inventory is read at once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

import pytest

from einsora.common.bus import names

if TYPE_CHECKING:
    from services.scheduler.tests.conftest import Sim, StartScheduler

from services.scheduler.tests.conftest import inventory

REWRITES = 25
REWRITE_EVERY_S = 0.1
"""How often the misbehaving machine rewrites its inventory: over two seconds, so the scheduler
reads several of its values at its pace."""
REFUSED = "a machine's value refused"
TOO_LARGE = 300 * 1024
"""Bytes over what an inventory may have (256 KiB), under what a machine may publish."""


def _refusals(caplog: pytest.LogCaptureFixture, machine_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage().startswith(REFUSED) and getattr(r, "machine_id", None) == machine_id
    ]


async def test_an_inventory_over_its_limits_is_refused_in_one_log_line_and_the_last_stands(
    sim: Sim,
    start_scheduler: StartScheduler,
    sqlite_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="einsora.scheduler.machines")
    await sim.join("m-1", gpus=1)
    await start_scheduler(sqlite_url)
    first = await sim.launch()
    await sim.wait_state(first, "scheduled")
    second = await sim.launch()
    await sim.wait_state(second, "queued")

    # It claims 300 GPUs (over the 256 an inventory may list), then sends a value over the
    # bytes an inventory may have: neither is believed, and it is said once.
    claim = inventory("m-1", gpus=1).model_dump(mode="json")
    claim["gpus"] = [dict(claim["gpus"][0], index=i, uuid=f"GPU-m-1-{i}") for i in range(300)]
    too_many = json.dumps(claim).encode()
    too_large = (
        inventory("m-1", gpus=1)
        .to_bytes()
        .replace(b'"hostname":"m-1"', b'"hostname":"' + b"h" * TOO_LARGE + b'"')
    )
    key = names.inventory_key("m-1")
    for i in range(REWRITES):
        await sim.machines.put(key, too_large if i == REWRITES - 1 else too_many)
        await asyncio.sleep(REWRITE_EVERY_S)  # the machine's own pace, not a wait
    await sim.until(lambda: _refusals(caplog, "m-1"), within_s=5, what="the refusal said")
    assert sim.state(second) == "queued"

    # A readable inventory stands again at once: the second workload gets the new GPU.
    await sim.machines.put(key, inventory("m-1", gpus=2).to_bytes())
    await sim.wait_state(second, "scheduled", within_s=5)
    [line] = _refusals(caplog, "m-1")
    assert line.levelno == logging.WARNING
    assert line.exc_info is None  # a sentence, not a traceback
    assert "gpus" in str(getattr(line, "error", ""))


async def test_a_machine_rewriting_its_inventory_in_a_loop_is_read_at_a_bounded_pace(
    sim: Sim, start_scheduler: StartScheduler, sqlite_url: str
) -> None:
    await sim.join("m-1", gpus=1)
    service = await start_scheduler(sqlite_url)
    watch = service._watch  # what the engine was handed, as the scheduler's watch counts it
    assert watch is not None
    read_before = watch.machine_values_read
    key = names.inventory_key("m-1")
    values = [
        inventory("m-1", gpus=1).model_copy(update={"hostname": f"m-1-{i}"}).to_bytes()
        for i in range(200)
    ]
    for value in values:
        await sim.machines.put(key, value)
    await sim.machines.put(key, inventory("m-1", gpus=2).to_bytes())  # the latest is read
    both = await sim.launch(count=2)
    await sim.wait_state(both, "scheduled", within_s=5)
    # The first rewrite at once, then one per second at most: the latest.
    assert watch.machine_values_read - read_before <= 4, watch.machine_values_read

    # Another machine's first inventory is read at once, flood or not.
    started = time.monotonic()
    await sim.join("m-2", gpus=1, gpu_class="a100-80gb")
    other = await sim.launch("a100-80gb")
    await sim.wait_state(other, "scheduled", within_s=2)
    print(f"a first inventory read and placed on in {time.monotonic() - started:.2f} s")
