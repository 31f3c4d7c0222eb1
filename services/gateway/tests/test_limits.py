"""Requests and tokens per minute per key: exact under bursts, across gateway processes.

Tokens are reserved at admission (prompt plus `max_tokens`), so a burst cannot overrun a limit,
and settled with the real count afterwards, so a short answer gives back what it did not use.
The sim endpoint's counts are exact, so each test works out by hand how many requests fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from nats.js.errors import NoKeysError

from einsora.common import simtext
from einsora.common.bus import names
from einsora.common.schemas import GatewayKey, SimEndpoint
from einsora.common.testing import subprocess_env
from einsora.gateway.testing import PINNED_NOW, Harness

PROMPT = "How many tokens is this prompt, exactly?"
PROMPT_TOKENS = simtext.chat_prompt_tokens([{"content": PROMPT}])
ANSWER_TOKENS = 16
"""What the sim endpoint answers (its default), so a request with this max_tokens uses all of
what it reserved."""


async def _ask(
    client: openai.AsyncOpenAI, max_tokens: int = ANSWER_TOKENS
) -> openai.RateLimitError | None:
    """One chat completion: None when answered, the 429 when refused (anything else raises)."""
    try:
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens
        )
    except openai.RateLimitError as refused:
        return refused
    return None


async def _burst(client: openai.AsyncOpenAI, n: int) -> list[openai.RateLimitError | None]:
    return await asyncio.gather(*(_ask(client) for _ in range(n)))


async def _counters_become(
    harness: Harness, key: GatewayKey, wanted: dict[str, int], now: float = PINNED_NOW
) -> None:
    """Settlements are queued off the request's path: wait for the shared counters."""
    deadline = asyncio.get_running_loop().time() + 10
    while (seen := await harness.counters(key, now)) != wanted:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"counters {seen}, not {wanted}")
        await asyncio.sleep(0.02)


async def test_requests_per_minute_hold_exactly_under_a_burst(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, key = await harness.key(rpm=20)
    async with harness.client(secret) as client:
        results = await _burst(client, 50)
    refused = [r for r in results if r is not None]
    assert len(refused) == 30  # and so exactly 20 answered
    for error in refused:
        assert error.code == "rate_limit_exceeded"
        assert error.response.headers["Retry-After"] == "30"  # the pinned clock is at :30.5
        assert error.response.headers["X-Request-ID"]
    assert await harness.counters(key, PINNED_NOW) == {"requests": 20, "tokens": 0}
    assert len(await harness.usage(20)) == 20


async def test_tokens_per_minute_hold_exactly_under_a_burst(harness: Harness) -> None:
    await harness.replica("tiny", SimEndpoint(completion_tokens=ANSWER_TOKENS))
    per_request = PROMPT_TOKENS + ANSWER_TOKENS
    fits = 7
    secret, key = await harness.key(tpm=fits * per_request)
    async with harness.client(secret) as client:
        results = await _burst(client, 50)
    assert results.count(None) == fits
    assert await harness.counters(key, PINNED_NOW) == {
        "requests": fits,
        "tokens": fits * per_request,
    }
    usages = await harness.usage(fits)
    assert sum(u.prompt_tokens + u.completion_tokens for u in usages) == fits * per_request


async def test_the_real_count_replaces_the_reservation(harness: Harness) -> None:
    # Each request reserves prompt + 100 but uses prompt + 16: what it did not use comes back,
    # so more requests fit one after another than a burst would admit.
    await harness.replica("tiny", SimEndpoint(completion_tokens=ANSWER_TOKENS))
    reserved, used = PROMPT_TOKENS + 100, PROMPT_TOKENS + ANSWER_TOKENS
    tpm = 2 * reserved
    fits = 0
    while fits * used + reserved <= tpm:
        fits += 1
    assert fits > 2
    secret, key = await harness.key(tpm=tpm)
    async with harness.client(secret) as client:
        for _ in range(fits):
            assert await _ask(client, max_tokens=100) is None
            # The settlement is queued behind the answer; the next admission must see it.
            await _counters_become(harness, key, {"requests": _ + 1, "tokens": (_ + 1) * used})
        assert await _ask(client, max_tokens=100) is not None


async def test_a_request_no_replica_answered_gives_its_tokens_back(harness: Harness) -> None:
    replica = await harness.replica("tiny")
    await replica.server.stop()  # the route stays: a replica that died unannounced
    secret, key = await harness.key(tpm=1000)
    async with harness.client(secret) as client:
        with pytest.raises(openai.APIStatusError) as failed:
            await _ask(client)
    assert failed.value.status_code == 503
    await _counters_become(harness, key, {"requests": 1, "tokens": 0})


async def test_a_request_too_large_for_the_limit_is_refused_with_the_reason(
    harness: Harness,
) -> None:
    replica = await harness.replica("tiny")
    secret, _ = await harness.key(tpm=PROMPT_TOKENS + 10)
    async with harness.client(secret) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await _ask(client, max_tokens=11)
    assert refused.value.code == "request_too_large"
    assert "lower max_tokens" in refused.value.message
    assert replica.server.requests == 0


async def test_a_key_without_limits_never_touches_the_shared_counters(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, key = await harness.key()
    async with harness.client(secret) as client:
        assert await _burst(client, 10) == [None] * 10
    kv = await harness.js.key_value(names.GATEWAY_LIMITS.name)
    with contextlib.suppress(NoKeysError):
        assert not [k for k in await kv.keys() if k.startswith(key.key_id)]


@contextlib.asynccontextmanager
async def _gateway_process(nats_url: str, data_dir: Path) -> AsyncIterator[int]:
    """`python -m einsora.gateway` (= `einsora gateway`) as its own process; yields its port."""
    log = (data_dir / "gateway.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "einsora.gateway",
        "--nats",
        nats_url,
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        env=subprocess_env(EINSORA_LOG_FORMAT="text"),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        assert line.startswith(b"gateway listening on port "), line
        yield int(line.split()[-1])
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=15)
        log.close()


async def test_two_gateway_processes_share_one_tokens_limit(
    real_clock_harness: Harness, tmp_path: Path
) -> None:
    harness = real_clock_harness
    await harness.replica("tiny", SimEndpoint(completion_tokens=ANSWER_TOKENS))
    fits = 6
    secret, key = await harness.key(tpm=fits * (PROMPT_TOKENS + ANSWER_TOKENS))
    async with _gateway_process(harness.nats_url, tmp_path) as port:
        other_url = f"http://127.0.0.1:{port}/v1"
        async with harness.client(secret) as here, harness.client(secret, other_url) as there:
            while True:  # the other process learns the key and route through its own mirrors
                with contextlib.suppress(openai.AuthenticationError):
                    if [m.id async for m in there.models.list()] == ["tiny"]:
                        break
                await asyncio.sleep(0.05)
            # Both processes use the real clock: start well inside a minute, so the burst
            # is judged against one window.
            if time.time() % 60 > 45:
                await asyncio.sleep(61 - time.time() % 60)
            started = time.time()
            results = await asyncio.gather(_burst(here, 25), _burst(there, 25))
    answered = [r for r in results[0] + results[1] if r is None]
    assert len(answered) == fits
    assert await harness.counters(key, started) == {
        "requests": fits,
        "tokens": fits * (PROMPT_TOKENS + ANSWER_TOKENS),
    }


async def test_the_reservation_covers_every_answer_a_request_asks_for(harness: Harness) -> None:
    # Three prompts in one completion request: three answers of up to max_tokens each.
    await harness.replica("tiny")
    prompts = ["one", "two three", "four, five"]
    needed = simtext.completion_prompt_tokens(prompts) + 3 * 4
    tight, _ = await harness.key(tpm=needed - 1)
    enough, key = await harness.key(tpm=needed)
    async with harness.client(tight) as client:
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="tiny", prompt=prompts, max_tokens=4)
    async with harness.client(enough) as client:
        answer = await client.completions.create(model="tiny", prompt=prompts, max_tokens=4)
    assert len(answer.choices) == 3
    assert await harness.counters(key, PINNED_NOW) == {"requests": 1, "tokens": needed}
