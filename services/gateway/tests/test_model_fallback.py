"""An endpoint's model fallback (ADR-0022): when no replica of the asked model answers (none
runs, or each fails before a byte reached the client), the gateway sends the request to the
endpoint's `{"model": …}` steps in order, only to models the key may use, and says which
model answered."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from einsora.common.schemas import SimEndpoint
from einsora.gateway.app import FALLBACK_HEADER
from einsora.gateway.testing import Harness


async def _ask(client: openai.AsyncOpenAI, model: str) -> Any:
    return await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Hello."}], max_tokens=4
    )


async def test_a_model_with_no_running_replica_falls_back_in_order(harness: Harness) -> None:
    small = await harness.replica("small")
    await harness.model_fallback("big", ["medium", "small"])  # medium runs nowhere
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        answer = await _ask(client, "big")
    assert answer.http_response.status_code == 200
    assert answer.headers[FALLBACK_HEADER] == "small"
    assert answer.parse().choices[0].message.content
    assert small.server.requests == 1
    [usage] = await harness.usage(1)
    assert (usage.model, usage.endpoint, usage.status) == ("big", small.route.workload_id, 200)


async def test_a_model_whose_replicas_all_fail_falls_back(harness: Harness) -> None:
    failing = await harness.replica("big", SimEndpoint(fail_rate=1.0))
    small = await harness.replica("small")
    await harness.model_fallback("big", ["small"])
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        answer = await _ask(client, "big")
        plain = await _ask(client, "small")
    assert answer.headers[FALLBACK_HEADER] == "small"
    assert FALLBACK_HEADER not in plain.headers  # asked for, not fallen back to
    assert failing.server.requests == 1
    assert small.server.requests == 2


async def test_a_healthy_model_never_falls_back(harness: Harness) -> None:
    big = await harness.replica("big")
    small = await harness.replica("small")
    await harness.model_fallback("big", ["small"])
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        answer = await _ask(client, "big")
    assert FALLBACK_HEADER not in answer.headers
    assert (big.server.requests, small.server.requests) == (1, 0)


async def test_a_key_reaches_only_the_models_it_may_use(harness: Harness) -> None:
    small = await harness.replica("small")
    await harness.model_fallback("big", ["small"])
    secret, _ = await harness.key(models=["big"])
    async with harness.client(secret) as client:
        with pytest.raises(openai.NotFoundError):
            await _ask(client, "big")
    assert small.server.requests == 0
