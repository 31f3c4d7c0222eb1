"""While NATS is away the gateway keeps serving from memory, and loses no usage record.

Keys and routes are mirrored in memory, so a key without limits is served as before. A key with
limits cannot be admitted without the shared counters: it is refused with a 503 that says why,
never let through unchecked. The usage of what was served is published once the bus is back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from einsora.common.bus import connect, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.testing import until
from einsora.gateway.testing import PINNED_NOW, Harness, StartUpstream, harness


@pytest_asyncio.fixture
async def own_harness(
    own_nats_server: EmbeddedNats, data_dir: Path, start_upstream: StartUpstream
) -> AsyncIterator[Harness]:
    """A harness on a server of the test's own, which it stops and starts."""
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    try:
        url = own_nats_server.url
        async with harness(js, url, data_dir, start_upstream, lambda: PINNED_NOW) as made:
            yield made
    finally:
        await nc.close()


async def test_served_from_memory_while_the_bus_is_away_and_usage_follows(
    own_harness: Harness, own_nats_server: EmbeddedNats
) -> None:
    h = own_harness
    replica = await h.replica("tiny")
    plain, _ = await h.key()
    limited, _ = await h.key(rpm=100)
    own_nats_server.stop()
    async with h.client(plain) as client:
        answer = await client.completions.create(model="tiny", prompt="still here", max_tokens=3)
    assert answer.choices[0].text
    async with h.client(limited) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.completions.create(model="tiny", prompt="still here", max_tokens=3)
    assert refused.value.status_code == 503
    assert refused.value.code == "limits_unavailable"
    assert replica.server.requests == 1

    own_nats_server.start()
    [usage] = await h.usage(1, within_s=30)
    assert usage.completion_tokens == 3
    await until(lambda: h.gateway.usage is not None and h.gateway.usage.pending == 0)
