"""The api's machines view believes a machine's inventory only within its limits (issue 34, N7):
one over them is skipped in one log line naming the machine, the last readable one stands, and
a machine rewriting in a loop is read at a bounded pace, the latest kept."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from einsora.api.views.machines import MachinesView
from einsora.common.bus import connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import Gpu, Inventory
from einsora.common.testing import until

MACHINE = "m-loud"
REWRITES = 20
REWRITE_EVERY_S = 0.1
"""The machine's own pace: two seconds of rewrites, so the view reads several of them."""
SKIPPED = "a machine's value skipped"


def _inventory(gpus: int, hostname: str = MACHINE) -> Inventory:
    return Inventory(
        machine_id=MACHINE,
        region="lab",
        hostname=hostname,
        os="linux",
        arch="x86_64",
        cpus=8,
        memory_mib=16 * 1024,
        gpus=[
            Gpu(index=i, uuid=f"GPU-{i}", model="NVIDIA L40S", memory_mib=46068)
            for i in range(gpus)
        ],
        drivers=["sim"],
    )


def _gpus(view: MachinesView) -> int | None:
    [record] = view.snapshot()
    return None if record.inventory is None else len(record.inventory.gpus)


async def test_an_inventory_over_its_limits_is_skipped_in_one_log_line(
    own_nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="einsora.api.views.machines")
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    kv = await js.key_value(names.MACHINES.name)
    key = names.inventory_key(MACHINE)
    await kv.put(key, _inventory(1).to_bytes())
    view = MachinesView()
    await view.start(nc, js)
    try:
        assert _gpus(view) == 1
        claim = _inventory(1).model_dump(mode="json")
        claim["gpus"] = [dict(claim["gpus"][0], index=i, uuid=f"GPU-{i}") for i in range(300)]
        for _ in range(REWRITES):
            await kv.put(key, json.dumps(claim).encode())
            await asyncio.sleep(REWRITE_EVERY_S)  # the machine's own pace, not a wait

        def skipped() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith(SKIPPED)]

        await until(lambda: skipped(), within_s=5)
        assert _gpus(view) == 1  # the last readable inventory stands

        await kv.put(key, _inventory(2).to_bytes())
        await until(lambda: _gpus(view) == 2, within_s=5)
        [line] = skipped()
        assert getattr(line, "machine_id", None) == MACHINE
        assert line.exc_info is None
    finally:
        await view.stop()
        await nc.close()


async def test_a_machine_rewriting_in_a_loop_is_read_at_a_bounded_pace(
    own_nats_server: EmbeddedNats,
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    kv = await js.key_value(names.MACHINES.name)
    key = names.inventory_key(MACHINE)
    view = MachinesView()
    await view.start(nc, js)
    parsed: list[str] = []
    real = Inventory.from_bytes

    def counting(data: bytes) -> Inventory:
        inventory = real(data)
        parsed.append(inventory.hostname)
        return inventory

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Inventory, "from_bytes", counting)
            for i in range(100):
                await kv.put(key, _inventory(1, hostname=f"{MACHINE}-{i}").to_bytes())
            await kv.put(key, _inventory(2, hostname="latest").to_bytes())
            await until(lambda: _gpus(view) == 2, within_s=5)
        assert parsed[-1] == "latest"
        assert len(parsed) <= 4, parsed
    finally:
        await view.stop()
        await nc.close()
