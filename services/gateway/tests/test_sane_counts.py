"""Counts are sane: an upstream is believed only about its own answer, within what the request
could use (issue 34, N8).

A machine that hosts another tenant's endpoint answers with whatever `usage` it likes. The
gateway caps a completion count at what was reserved for the answer (`max_tokens` for each
answer) and a prompt count at what the request's size allows, counts itself what is no count
at all (negative, 2^31 or more, 1.5, "12", true), notes each cap on the request's usage message with
what was claimed and by whom, and counts it in a metric. The upstream here is a real HTTP
server that lies.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from einsora.common.schemas import CountSource, TokenUsage
from einsora.common.schemas.endpoint import CapReason, TokenKind
from einsora.gateway.caps import PROMPT_ALLOWANCE
from einsora.gateway.counting import estimate
from einsora.gateway.testing import PINNED_NOW, Harness

TEXT = "The answer is long enough to count."
"""What the lying upstream generates (the gateway's own estimate of it is 9 tokens)."""
PROMPT = "Count me, exactly."


class LyingUpstream:
    """An OpenAI-compatible server that answers every request with `TEXT` and the `usage` it
    is told to claim (None: none, as llama.cpp's streams), whole or as a stream (with its usage
    chunk when asked for one); its llama.cpp tokenizer makes a thousand tokens of each byte."""

    def __init__(self, usage: dict[str, Any] | None) -> None:
        self.usage = usage
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._answer)
        app.router.add_post("/v1/completions", self._answer)
        app.router.add_post("/extras/tokenize", self._tokenize)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _tokenize(self, request: web.Request) -> web.Response:
        text = (await request.json())["input"]
        return web.json_response({"tokens": [1] * (1000 * len(text.encode()))})

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if not body.get("stream"):
            choice.update({"message": {"role": "assistant", "content": TEXT}} if chat else {})
            choice.update({} if chat else {"text": TEXT})
            usage = {} if self.usage is None else {"usage": self.usage}
            return web.json_response({"id": "x", "choices": [choice], **usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        choice.update({"delta": {"content": TEXT}} if chat else {"text": TEXT})
        events: list[object] = [{"id": "x", "choices": [choice]}]
        if self.usage is not None and (body.get("stream_options") or {}).get("include_usage"):
            events.append({"id": "x", "choices": [], "usage": self.usage})
        for event in events:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _lying(
    harness: Harness, usage: dict[str, Any] | None, runtime: str = "vllm"
) -> LyingUpstream:
    upstream = LyingUpstream(usage)
    await upstream.start()
    harness.servers.append(upstream)
    await harness.route("tiny", upstream.port, runtime=runtime)
    return upstream


async def _post(harness: Harness, secret: str, path: str, body: bytes) -> bytes:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{harness.base_url}/{path}",
            data=body,
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.read()


def _caps(usage: TokenUsage) -> set[tuple[str, str, str, str]]:
    return {(c.kind.value, c.source.value, c.claimed, c.reason.value) for c in usage.capped}


def _capped_metric(harness: Harness, kind: str, source: str, reason: str) -> float | None:
    return harness.gateway.metrics.registry.get_sample_value(
        "einsora_gateway_token_counts_capped_total",
        {"kind": kind, "source": source, "reason": reason},
    )


async def _counters_reach(harness: Harness, key: Any, wanted: dict[str, int]) -> None:
    """Settlements are queued off the request's path: wait for the shared counters."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (seen := await harness.counters(key, PINNED_NOW)) != wanted:
        if loop.time() > deadline:
            raise AssertionError(f"counters {seen}, not {wanted}")
        await asyncio.sleep(0.02)


async def test_an_answer_claiming_more_than_the_request_could_use_is_capped_and_noted(
    harness: Harness,
) -> None:
    await _lying(harness, {"prompt_tokens": 1_000_000_000, "completion_tokens": 100_000})
    secret, key = await harness.key(tpm=1_000_000)
    body = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5}
    ).encode()
    answer = json.loads(await _post(harness, secret, "chat/completions", body))
    assert answer["choices"][0]["message"]["content"] == TEXT  # the answer itself is passed on

    [usage] = await harness.usage(1)
    # No more than max_tokens of answer, and no more prompt than the request's size allows.
    assert usage.completion_tokens == 5
    assert usage.prompt_tokens == len(body) + PROMPT_ALLOWANCE
    assert usage.source is CountSource.upstream
    assert _caps(usage) == {
        ("prompt", "upstream", "1000000000", "above_request"),
        ("completion", "upstream", "100000", "above_request"),
    }
    assert _capped_metric(harness, "completion", "upstream", "above_request") == 1
    assert _capped_metric(harness, "prompt", "upstream", "above_request") == 1
    assert _capped_metric(harness, "prompt", "upstream", "not_a_count") == 0
    # The key's tokens per minute are settled with the capped count, not the claim.
    await _counters_reach(harness, key, {"requests": 1, "tokens": usage.prompt_tokens + 5})


async def test_a_streams_usage_chunk_is_capped_at_max_tokens_for_each_answer(
    harness: Harness,
) -> None:
    await _lying(harness, {"prompt_tokens": 6, "completion_tokens": 100_000})
    secret, _ = await harness.key()
    body = json.dumps(
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "n": 2, "stream": True}
    ).encode()
    streamed = await _post(harness, secret, "completions", body)
    assert b'"usage"' not in streamed  # the client did not ask for it: the gateway did

    [usage] = await harness.usage(1)
    assert (usage.prompt_tokens, usage.completion_tokens) == (6, 10)
    assert _caps(usage) == {("completion", "upstream", "100000", "above_request")}
    assert _capped_metric(harness, "completion", "upstream", "above_request") == 1


async def test_an_upstreams_tokenizer_is_believed_only_within_the_request_too(
    harness: Harness,
) -> None:
    # llama.cpp's stream has no usage: the gateway counts with the upstream's own tokenizer,
    # which here claims a thousand tokens a byte, for the reservation and for the count.
    await _lying(harness, None, runtime="llamacpp")
    secret, key = await harness.key(tpm=1_000_000)
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "stream": True}).encode()
    await _post(harness, secret, "completions", body)

    [usage] = await harness.usage(1)
    bound = len(body) + PROMPT_ALLOWANCE
    assert (usage.prompt_tokens, usage.completion_tokens) == (bound, 5)
    assert usage.source is CountSource.tokenizer
    assert _caps(usage) == {
        ("prompt", "tokenizer", str(1000 * len(PROMPT)), "above_request"),
        ("completion", "tokenizer", str(1000 * len(TEXT)), "above_request"),
    }
    assert _capped_metric(harness, "completion", "tokenizer", "above_request") == 1
    await _counters_reach(harness, key, {"requests": 1, "tokens": bound + 5})


@pytest.mark.parametrize(
    ("claim", "claimed"),
    [
        (2**70, str(2**70)),
        (2**31, "2147483648"),
        (-3, "-3"),
        (1.5, "1.5"),
        ("12", '"12"'),
        (True, "true"),
    ],
)
async def test_a_count_that_is_no_count_is_counted_by_the_gateway_itself(
    harness: Harness, claim: object, claimed: str
) -> None:
    await _lying(harness, {"prompt_tokens": claim, "completion_tokens": 2})
    secret, _ = await harness.key()
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 5}).encode()
    await _post(harness, secret, "completions", body)

    [usage] = await harness.usage(1)
    # The prompt as the gateway counts it for this runtime; the answer's sane count kept.
    assert (usage.prompt_tokens, usage.completion_tokens) == (estimate(PROMPT), 2)
    assert usage.source is CountSource.estimate
    assert [(c.kind, c.source, c.claimed, c.reason) for c in usage.capped] == [
        (TokenKind.prompt, CountSource.upstream, claimed, CapReason.not_a_count)
    ]
    assert _capped_metric(harness, "prompt", "upstream", "not_a_count") == 1
