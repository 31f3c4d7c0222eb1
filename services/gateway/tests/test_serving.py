"""The gateway as a client of OpenAI's API meets it: the `openai` SDK, unchanged, streaming too.

Counts published on `usage.tokens.<tenant>` must equal what the upstream reported (or, where it
reports nothing, what the model's own tokenizer counts), the usage chunk the gateway asks for on
a client's behalf never reaches that client, and a key or route removed from KV stops serving
at once.
"""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from einsora.common import simtext
from einsora.common.schemas import CountSource, SimEndpoint
from einsora.common.testing import Bus, until
from einsora.gateway.testing import PINNED_NOW, Harness

SYSTEM, USER = "You answer in few words.", "Name three colours, please!"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": USER},
]
SEED = f"{SYSTEM}\n{USER}"
PROMPT_TOKENS = simtext.chat_prompt_tokens([{"content": SYSTEM}, {"content": USER}])


async def test_a_chat_completion_is_answered_and_counted_as_the_upstream_reported(
    harness: Harness,
) -> None:
    replica = await harness.replica("tiny")
    secret, key = await harness.key()
    async with harness.client(secret) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, max_tokens=8, extra_headers={"X-Request-ID": "r-1"}
        )
    answer = raw.parse()
    assert raw.headers["x-request-id"] == "r-1"
    assert answer.choices[0].message.content == simtext.answer(SEED, 8)
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (PROMPT_TOKENS, 8)

    [usage] = await harness.usage(1)
    assert usage.request_id == "r-1"
    assert (usage.tenant_id, usage.key_id, usage.model) == (harness.tenant, key.key_id, "tiny")
    assert usage.endpoint == replica.route.workload_id
    assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS, 8)
    assert (usage.source, usage.status) == (CountSource.upstream, 200)


async def test_completions_and_embeddings_are_served_and_counted(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        completion = await client.completions.create(
            model="tiny", prompt="Once upon a time,", max_tokens=5
        )
        embedding = await client.embeddings.create(model="tiny", input=["one two", "three"])
    assert completion.choices[0].text == simtext.answer("Once upon a time,", 5)
    assert len(embedding.data) == 2
    assert embedding.data[1].embedding == simtext.embedding("three")

    usages = {u.prompt_tokens: u for u in await harness.usage(2)}
    assert usages[simtext.count("Once upon a time,")].completion_tokens == 5
    assert usages[3].completion_tokens == 0  # "one two" and "three": 3 tokens, no completion
    assert all(u.source is CountSource.upstream for u in usages.values())


async def test_the_keys_default_max_tokens_is_sent_when_the_client_sends_none(
    harness: Harness,
) -> None:
    await harness.replica("tiny", SimEndpoint(completion_tokens=16))
    secret, _ = await harness.key(max_tokens_default=5)
    async with harness.client(secret) as client:
        answer = await client.chat.completions.create(model="tiny", messages=MESSAGES)
        bounded = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_completion_tokens=3
        )
    # The upstream was asked for 5, so a 16-token answer was cut at 5.
    assert answer.choices[0].message.content == simtext.answer(SEED, 5)
    assert answer.choices[0].finish_reason == "length"
    assert bounded.choices[0].message.content == simtext.answer(SEED, 3)


async def test_a_stream_whose_client_did_not_ask_for_usage_gets_none_yet_is_counted(
    harness: Harness,
) -> None:
    replica = await harness.replica("tiny")
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        stream = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)  # no usage chunk (it has no choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == simtext.answer(SEED, 12)

    [usage] = await harness.usage(1)
    assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS, 12)
    assert usage.source is CountSource.upstream  # the gateway asked the upstream for it
    assert usage.endpoint == replica.route.workload_id


async def test_a_stream_whose_client_asked_for_usage_gets_it(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (PROMPT_TOKENS, 7)

    [usage] = await harness.usage(1)
    assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS, 7)
    assert usage.source is CountSource.upstream


@pytest.mark.parametrize("runtime", ["sim", "llamacpp"])
async def test_a_stream_without_upstream_usage_is_counted_with_the_models_tokenizer(
    harness: Harness, runtime: str
) -> None:
    # llama.cpp's server never sends a stream's usage; the gateway counts the text it passed
    # with the model's own tokenizer: the sim rules, or the upstream's /extras/tokenize.
    await harness.replica("tiny", SimEndpoint(stream_usage=False), runtime=runtime)
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        stream = await client.completions.create(
            model="tiny", prompt="Count me, exactly.", max_tokens=9, stream=True
        )
        text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    assert text == simtext.answer("Count me, exactly.", 9)

    [usage] = await harness.usage(1)
    assert usage.source is CountSource.tokenizer
    assert usage.completion_tokens == 9
    assert usage.prompt_tokens == simtext.count("Count me, exactly.")


async def test_models_lists_the_running_models_the_key_may_use(harness: Harness) -> None:
    await harness.replica("alpha")
    await harness.replica("beta")
    gone = await harness.replica("gamma")
    await harness.unroute(gone.route)
    await until(lambda: not harness.gateway.models.replicas(harness.tenant, "gamma"))
    every, _ = await harness.key()
    only_alpha, _ = await harness.key(models=["alpha", "delta"])
    stranger, _ = await harness.key(tenant_id="t-someone-else")
    async with harness.client(every) as client:
        assert [m.id async for m in client.models.list()] == ["alpha", "beta"]
    async with harness.client(only_alpha) as client:
        assert [m.id async for m in client.models.list()] == ["alpha"]
        with pytest.raises(openai.NotFoundError) as refused:
            await client.chat.completions.create(model="beta", messages=MESSAGES)
        assert refused.value.code == "model_not_found"
    async with harness.client(stranger) as client:
        assert [m.id async for m in client.models.list()] == []


async def test_a_revoked_key_is_refused_within_a_second(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, key = await harness.key()
    async with harness.client(secret) as client:
        await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
        await harness.revoke(key)
        await until(
            lambda: harness.gateway.keys.authenticate(f"Bearer {secret}") is None, within_s=1.0
        )
        with pytest.raises(openai.AuthenticationError) as refused:
            await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
    assert refused.value.status_code == 401
    assert refused.value.code == "invalid_api_key"
    assert refused.value.response.headers["x-request-id"]


async def test_an_expired_key_is_refused(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, _ = await harness.key(expires_at=datetime.fromtimestamp(PINNED_NOW - 1, UTC))
    async with harness.client(secret) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()


async def test_a_deleted_route_is_not_found_as_soon_as_the_gateway_hears_of_it(
    harness: Harness,
) -> None:
    replica = await harness.replica("tiny")
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
        await harness.unroute(replica.route)
        await until(lambda: not harness.gateway.models.replicas(harness.tenant, "tiny"))
        with pytest.raises(openai.NotFoundError) as refused:
            await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
    assert refused.value.code == "model_not_found"
    assert replica.server.requests == 1  # the replica, still up, was not asked again


async def test_bad_input_is_a_4xx_in_openais_shape_with_the_request_id(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, _ = await harness.key()
    url = harness.base_url + "/chat/completions"
    auth = {"Authorization": f"Bearer {secret}"}
    cases: list[tuple[dict[str, str], bytes, int, str | None]] = [
        (auth, b"{not json", 400, None),
        (auth, b"[1, 2]", 400, None),
        (auth, b'{"messages": []}', 400, "model"),
        (auth, b'{"model": "tiny", "messages": [], "max_tokens": 0}', 400, "max_tokens"),
        (auth, b'{"model": "nope", "messages": []}', 404, "model"),
        (auth, b"{" + b" " * (4 * 1024 * 1024) + b"}", 413, None),
        ({"Authorization": "Bearer esk_not-a-key"}, b'{"model": "tiny"}', 401, None),
        ({}, b'{"model": "tiny"}', 401, None),
    ]
    async with aiohttp.ClientSession() as http:
        for headers, body, status, param in cases:
            async with http.post(url, data=io.BytesIO(body), headers=headers) as response:
                assert response.status == status, body[:40]
                answer = await response.json()
                request_id = response.headers["X-Request-ID"]
            assert request_id.startswith("req-")
            assert answer["request_id"] == request_id
            assert set(answer["error"]) == {"message", "type", "param", "code"}
            assert answer["error"]["message"]
            assert answer["error"]["param"] == param
            assert secret not in str(answer)
        # A sane request ID of the client's is kept; anything else is replaced.
        for sent, kept in (("abc-123", True), ("two words", False)):
            async with http.post(
                url, data=b"{}", headers={**auth, "X-Request-ID": sent}
            ) as response:
                assert (response.headers["X-Request-ID"] == sent) is kept
        async with http.get(url, headers=auth) as response:
            assert response.status == 405
            assert (await response.json())["error"]["code"] == "method_not_allowed"


async def test_a_large_prompt_is_served_and_counted(harness: Harness) -> None:
    await harness.replica("tiny")
    secret, key = await harness.key(tpm=1_000_000)  # so the gateway counts the prompt too
    prompt = "word " * 200_000  # 1 MB: the sim endpoint takes bodies up to 1 MiB
    async with harness.client(secret) as client:
        answer = await client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == 200_000
    # Reserved at admission: the prompt as the gateway counted it, plus max_tokens.
    assert await harness.counters(key, PINNED_NOW) == {"requests": 1, "tokens": 200_002}


async def test_an_unreadable_request_is_answered_without_quoting_it(harness: Harness) -> None:
    # aiohttp's own answer would quote the offending header, key and all.
    reader, writer = await asyncio.open_connection("127.0.0.1", harness.gateway.port)
    writer.write(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer esk_secret\x01value\r\n\r\n"
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400"
    assert b"X-Request-ID: req-" in head
    assert b"esk_secret" not in answer
    assert json.loads(body)["error"]["message"]


async def test_an_mlx_upstream_is_asked_for_its_own_model_not_the_endpoints_name(
    harness: Harness,
) -> None:
    # mlx-lm's server would load whatever `model` names; its own is "default_model".
    server = await harness.start_upstream("default_model", None)
    harness.servers.append(server)
    await harness.route("tiny", server.port, runtime="mlx")
    secret, _ = await harness.key()
    async with harness.client(secret) as client:
        answer = await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    assert answer.choices[0].message.content == simtext.answer(SEED, 3)


async def test_a_route_to_the_control_planes_own_port_is_never_followed(
    harness: Harness, bus: Bus
) -> None:
    # Issue 34, N1 (ADR-0026): whatever wrote the route, a tenant's prompts never go to the
    # bus's port, nor to the gateway's own.
    nats_port = int(bus.url.rsplit(":", 1)[1])
    await harness.route("bus", nats_port, wait=False)
    await harness.route("itself", harness.gateway.port, wait=False)
    await harness.replica("tiny")
    secret, _key = await harness.key()
    async with harness.client(secret) as client:
        for _ in range(200):  # the good one's route is read after the two refused ones
            listed = {m.id for m in (await client.models.list()).data}
            if "tiny" in listed:
                break
            await asyncio.sleep(0.02)
        assert listed == {"tiny"}
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="bus", messages=MESSAGES, max_tokens=2)
