"""Failover between a model's replicas: retried before any byte reached the client, never after.

A replica that is stopped (its route still there, as when its machine dies before the
scheduler notices) drops its connections and refuses new ones; a replica that answers 5xx is
avoided for a few seconds. Neither is an error to a client whose answer had not started; a
stream cut mid-way is an error to its client and is not retried.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from einsora.common.schemas import CountSource, SimEndpoint
from einsora.common.testing import until
from einsora.gateway.testing import Harness, Replica


async def _ask(client: openai.AsyncOpenAI) -> str:
    answer = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Keep going."}],
        max_tokens=4,
    )
    return answer.choices[0].message.content or ""


async def test_no_client_sees_an_error_when_a_replica_is_stopped_mid_run(
    harness: Harness,
) -> None:
    slow = SimEndpoint(latency_ms=150)
    first = await harness.replica("tiny", slow)
    second = await harness.replica("tiny", slow)
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        burst = [asyncio.create_task(_ask(client)) for _ in range(30)]
        # Requests are in flight on both replicas when one of them goes away.
        await until(lambda: first.server.requests >= 5 and second.server.requests >= 5)
        await first.server.stop()
        answers = await asyncio.gather(*burst)
        after = [await _ask(client) for _ in range(10)]
    assert all(answers)
    assert all(after)
    usages = await harness.usage(40)
    assert {u.status for u in usages} == {200}
    # Those cut on the stopped replica were answered by the other; later ones went there.
    assert sum(u.endpoint == second.route.workload_id for u in usages) > 20


async def test_a_stream_cut_mid_way_is_an_error_to_its_client_and_not_retried(
    harness: Harness,
) -> None:
    paced = SimEndpoint(tokens_per_s=50, completion_tokens=200)
    replicas = [await harness.replica("tiny", paced), await harness.replica("tiny", paced)]
    secret, _ = await harness.key()
    received: list[str] = []
    async with harness.client(secret) as client:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Keep going."}],
            max_tokens=200,
            stream=True,
        )
        stopped: list[Replica] = []

        async def read_and_stop_the_replica_after_three_tokens() -> None:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
                if len(received) == 3 and not stopped:
                    stopped.append(next(r for r in replicas if r.server.requests == 1))
                    await stopped[0].server.stop()

        # The body ends without its last chunk: the SDK reports a broken connection.
        with pytest.raises(openai.APIConnectionError):
            await read_and_stop_the_replica_after_three_tokens()
    serving = stopped[0]
    other = next(r for r in replicas if r is not serving)
    assert other.server.requests == 0  # not retried after bytes reached the client
    assert 3 <= len(received) < 200
    [usage] = await harness.usage(1)
    assert usage.status == 502
    assert usage.endpoint == serving.route.workload_id
    # No usage came from the upstream: what was passed is counted with the model's tokenizer.
    assert usage.source is CountSource.tokenizer
    assert usage.completion_tokens == len(received)


async def test_a_replica_answering_5xx_is_retried_elsewhere_and_avoided(
    harness: Harness,
) -> None:
    failing = await harness.replica("tiny", SimEndpoint(fail_rate=1.0))
    healthy = await harness.replica("tiny")
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        answers = [await _ask(client) for _ in range(10)]
    assert all(answers)
    assert failing.server.requests == 1  # then avoided (tried last) for the next 5 s
    assert healthy.server.requests == 10


async def test_when_no_replica_answers_the_client_gets_an_error_in_openais_shape(
    harness: Harness,
) -> None:
    down = await harness.replica("tiny")
    await down.server.stop()
    failing = await harness.replica("broken", SimEndpoint(fail_rate=1.0))
    secret, key = await harness.key()
    async with harness.client(secret) as client:
        with pytest.raises(openai.APIStatusError) as unavailable:
            await _ask(client)
        with pytest.raises(openai.InternalServerError) as failed:
            await client.completions.create(model="broken", prompt="hello", max_tokens=2)
    assert unavailable.value.status_code == 503
    assert unavailable.value.code == "upstream_unavailable"
    assert failed.value.status_code == 502
    assert failed.value.code == "upstream_error"
    assert failing.server.requests == 1
    usages = {u.model: u for u in await harness.usage(2)}
    assert (usages["tiny"].status, usages["broken"].status) == (503, 502)
    assert all(u.prompt_tokens == u.completion_tokens == 0 for u in usages.values())
    assert all(u.key_id == key.key_id for u in usages.values())
