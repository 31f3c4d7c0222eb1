"""The api's machines view across a NATS restart that lost its store (the test acts as agents).

`/v1/machines` and `/v1/classes` answer from this view; after the restart it must neither keep
machines the server no longer has nor miss the inventories written since.
"""

from __future__ import annotations

import shutil

import nats.errors

from einsora.api.views.machines import MachinesView
from einsora.common.bus import connect, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import Inventory
from einsora.common.testing import until


def _inventory(machine: str) -> Inventory:
    return Inventory(
        machine_id=machine,
        region="lab",
        hostname=machine,
        os="linux",
        arch="x86_64",
        cpus=8,
        memory_mib=16 * 1024,
        gpus=[],
        drivers=["sim"],
    )


async def test_the_view_follows_the_bucket_across_a_restart_that_lost_the_store(
    own_nats_server: EmbeddedNats,
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    kv = await js.key_value(names.MACHINES.name)
    await kv.put(names.inventory_key("m-old"), _inventory("m-old").to_bytes())
    view = MachinesView()
    await view.start(nc, js)
    try:
        assert [r.machine_id for r in view.snapshot()] == ["m-old"]

        own_nats_server.stop()
        shutil.rmtree(own_nats_server.data_dir / "jetstream")
        own_nats_server.start()
        # The agent's part: provision again (retried while JetStream comes up) and report.
        for attempt in range(5):
            try:
                await provision(js)
                break
            except nats.errors.TimeoutError:
                if attempt == 4:
                    raise
        kv = await js.key_value(names.MACHINES.name)
        await kv.put(names.inventory_key("m-new"), _inventory("m-new").to_bytes())

        await until(lambda: [r.machine_id for r in view.snapshot()] == ["m-new"], within_s=20)
    finally:
        await view.stop()
        await nc.close()
