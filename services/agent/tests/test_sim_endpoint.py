"""The sim endpoint: the OpenAI API as the `openai` SDK speaks it, exact usage by the sim
tokenizer, errors in OpenAI's shape, an abrupt stop; and sim endpoints run by the agent's sim
driver, served under their workload's name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionMessageParam

from einsora.agent.runtimes.sim_server import SimEndpointServer
from einsora.common import simtext
from einsora.common.schemas import ObservedPhase, SimEndpoint, Target, WorkloadKind
from einsora.common.testing import until
from einsora.testing.agent import ControlPlane, StartAgent

MODEL = "tiny-sim"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name three colours, please!"},
]
SEED = "You answer briefly.\nName three colours, please!"

Serve = Callable[..., Awaitable[SimEndpointServer]]


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start sim endpoint servers (`await serve(SimEndpoint(...))`); all stopped after."""
    started: list[SimEndpointServer] = []

    async def start(options: SimEndpoint | None = None, model: str = MODEL) -> SimEndpointServer:
        server = SimEndpointServer(model, options)
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


def client(server: SimEndpointServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://{server.host}:{server.port}/v1", api_key="unused", max_retries=0
    )


async def test_chat_answers_deterministic_text_with_exact_usage(serve: Serve) -> None:
    server = await serve(SimEndpoint(completion_tokens=12))
    async with client(server) as sdk:
        answer = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES)
        again = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES)
        cut = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)
    assert answer.model == MODEL
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == simtext.answer(SEED, 12)
    assert answer.choices[0].finish_reason == "stop"
    assert again.choices[0].message.content == answer.choices[0].message.content
    prompt = simtext.chat_prompt_tokens(MESSAGES)
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt, 12)
    assert answer.usage.total_tokens == prompt + 12
    assert cut.choices[0].message.content == simtext.answer(SEED, 5)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None
    assert cut.usage.completion_tokens == 5


async def test_max_completion_tokens_above_the_answer_does_not_cut_it(serve: Serve) -> None:
    server = await serve(SimEndpoint(completion_tokens=4))
    async with client(server) as sdk:
        answer = await sdk.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_completion_tokens=100,
        )
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 4


async def test_chat_stream_sends_a_chunk_per_token_and_usage_when_asked(serve: Serve) -> None:
    server = await serve(SimEndpoint(completion_tokens=6))
    async with client(server) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        plain = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        plain_chunks = [chunk async for chunk in plain]
    words = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(words) == 6
    assert words[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in words) == simtext.answer(SEED, 6)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop"
    assert set(finish[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        simtext.chat_prompt_tokens(MESSAGES),
        6,
    )
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    # Not asked: no usage chunk at all.
    assert all(c.choices for c in plain_chunks)
    assert all(c.usage is None for c in plain_chunks)
    assert "".join(c.choices[0].delta.content or "" for c in plain_chunks) == simtext.answer(
        SEED, 6
    )


async def test_a_stream_without_usage_like_llamacpp_sends_none_even_when_asked(
    serve: Serve,
) -> None:
    server = await serve(SimEndpoint(completion_tokens=3, stream_usage=False))
    async with client(server) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_completions_plain_and_streamed(serve: Serve) -> None:
    server = await serve(SimEndpoint(completion_tokens=8))
    prompt = "Once upon a time, in a land far away"
    async with client(server) as sdk:
        answer = await sdk.completions.create(model=MODEL, prompt=prompt, max_tokens=7)
        stream = await sdk.completions.create(
            model=MODEL, prompt=prompt, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert answer.object == "text_completion"
    assert answer.choices[0].text == simtext.answer(prompt, 7)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (
        simtext.completion_prompt_tokens(prompt),
        7,
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == simtext.answer(prompt, 8)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


async def test_embeddings_and_models(serve: Serve) -> None:
    server = await serve()
    async with client(server) as sdk:
        vectors = await sdk.embeddings.create(model=MODEL, input=["first text", "second, text"])
        models = await sdk.models.list()
    assert [d.embedding for d in vectors.data] == [
        simtext.embedding("first text"),
        simtext.embedding("second, text"),
    ]
    assert vectors.usage.prompt_tokens == simtext.count("first text") + simtext.count(
        "second, text"
    )
    assert [m.id for m in models.data] == [MODEL]


async def post(
    server: SimEndpointServer, path: str, body: bytes | dict[str, Any]
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{server.host}:{server.port}{path}", data=data) as response,
    ):
        return response.status, await response.json()


async def test_errors_come_in_openai_shape(serve: Serve) -> None:
    server = await serve()
    status, body = await post(server, "/v1/chat/completions", b"{not json")
    assert (status, body["error"]["type"]) == (400, "invalid_request_error")
    status, body = await post(server, "/v1/chat/completions", {"model": MODEL})
    assert (status, body["error"]["param"]) == (400, "messages")
    status, body = await post(server, "/v1/completions", {"model": MODEL})
    assert (status, body["error"]["param"]) == (400, "prompt")
    status, body = await post(server, "/v1/embeddings", {"model": MODEL, "input": 3})
    assert (status, body["error"]["param"]) == (400, "input")
    status, body = await post(
        server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 0}
    )
    assert (status, body["error"]["param"]) == (400, "max_tokens")
    status, body = await post(
        server, "/v1/chat/completions", {"model": "other", "messages": MESSAGES}
    )
    assert (status, body["error"]["code"]) == (404, "model_not_found")
    assert "other" in body["error"]["message"]


async def test_fail_rate_answers_500_and_the_sdk_sees_a_server_error(serve: Serve) -> None:
    server = await serve(SimEndpoint(fail_rate=1.0))
    status, body = await post(server, "/v1/completions", {"model": MODEL, "prompt": "hi"})
    assert (status, body["error"]["type"]) == (500, "server_error")
    async with client(server) as sdk:
        with pytest.raises(openai.InternalServerError):
            await sdk.chat.completions.create(model=MODEL, messages=MESSAGES)


async def test_some_prompts_fail_as_simtext_chooses(serve: Serve) -> None:
    server = await serve(SimEndpoint(fail_rate=0.5))
    prompts = [f"prompt number {i}" for i in range(20)]
    statuses = [
        (await post(server, "/v1/completions", {"model": MODEL, "prompt": p}))[0] for p in prompts
    ]
    assert statuses == [500 if simtext.fails(p, 0.5) else 200 for p in prompts]
    assert set(statuses) == {200, 500}


async def test_tokenize_health_and_request_count(serve: Serve) -> None:
    server = await serve()
    status, body = await post(server, "/extras/tokenize", {"input": "Hello, world!"})
    assert status == 200
    assert len(body["tokens"]) == simtext.count("Hello, world!") == 4
    assert all(isinstance(t, int) for t in body["tokens"])
    status, body = await post(server, "/extras/tokenize/count", {"input": "Hello, world!"})
    assert body == {"count": 4}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{server.host}:{server.port}/health") as response,
    ):
        assert response.status == 200
    assert server.requests == 3


async def test_stop_cuts_a_stream_in_progress_and_refuses_new_connections(
    serve: Serve,
) -> None:
    server = await serve(SimEndpoint(completion_tokens=10_000, tokens_per_s=50))
    url = f"http://{server.host}:{server.port}"
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            first = await response.content.readline()  # the first token came before the rest
            assert first.startswith(b"data: ")
            await server.stop()
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(response.read(), 30)  # the rest: cut, never [DONE]
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(f"{url}/health")


# --- on the agent's sim driver ----------------------------------------------------------------


async def test_a_sim_endpoint_serves_its_name_and_stops_with_its_workload(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    await start_agent(machine_id="m-se1", driver="sim")
    chat = control.workload(
        "w-chat",
        kind=WorkloadKind.endpoint,
        spec={"model": "/models/none.gguf", "runtime": "llamacpp", "sim": {"completion_tokens": 3}},
    ).model_copy(update={"name": "team-chat"})
    unnamed = control.workload("w-plain", kind=WorkloadKind.endpoint, spec={})
    notebook = control.workload("w-nb")
    await control.put_desired("m-se1", 1, [chat, unnamed, notebook])
    state = await control.wait_observed(
        "m-se1",
        lambda s: (
            len(s.workloads) == 3 and all(w.phase is ObservedPhase.running for w in s.workloads)
        ),
    )
    seen = {w.workload_id: w for w in state.workloads}
    assert seen["w-nb"].endpoint is None  # a sim notebook serves nothing
    endpoint = seen["w-chat"].endpoint
    assert endpoint is not None
    assert endpoint.runtime == "sim"
    async with openai.AsyncOpenAI(
        base_url=f"http://{endpoint.host}:{endpoint.port}/v1", api_key="unused", max_retries=0
    ) as sdk:
        answer = await sdk.chat.completions.create(model="team-chat", messages=MESSAGES)
        assert answer.choices[0].message.content == simtext.answer(SEED, 3)
        plain = seen["w-plain"].endpoint
        assert plain is not None
        async with openai.AsyncOpenAI(
            base_url=f"http://{plain.host}:{plain.port}/v1", api_key="unused"
        ) as other:
            models = await other.models.list()
        assert [m.id for m in models.data] == ["w-plain"]

        await control.put_desired("m-se1", 2, [chat.model_copy(update={"target": Target.parked})])
        await control.wait_workload("m-se1", "w-chat", lambda w: w.phase is ObservedPhase.parked)
        with pytest.raises(openai.APIConnectionError):
            await sdk.chat.completions.create(model="team-chat", messages=MESSAGES)


async def test_a_sim_endpoint_with_a_bad_spec_fails_naming_the_field(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    await start_agent(machine_id="m-se2", driver="sim")
    await control.put_desired(
        "m-se2",
        1,
        [
            control.workload(
                "w-rt", kind=WorkloadKind.endpoint, spec={"model": "m.gguf", "runtime": "onnx"}
            ),
            control.workload("w-lat", kind=WorkloadKind.endpoint, spec={"sim": {"latency_ms": -5}}),
        ],
    )
    state = await control.wait_observed(
        "m-se2",
        lambda s: (
            len(s.workloads) == 2 and all(w.phase is ObservedPhase.failed for w in s.workloads)
        ),
    )
    reasons = {w.workload_id: w.reason for w in state.workloads}
    assert "spec.runtime" in reasons["w-rt"]
    assert "spec.sim.latency_ms" in reasons["w-lat"]


async def test_a_sim_endpoint_that_fails_stops_answering(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    await start_agent(machine_id="m-se3", driver="sim")
    oom = control.workload(
        "w-oom",
        kind=WorkloadKind.endpoint,
        spec={"sim": {"fail": "CUDA out of memory", "fail_after_s": 1.0}},
    )
    await control.put_desired("m-se3", 1, [oom])
    up = await control.wait_workload("m-se3", "w-oom", lambda w: w.phase is ObservedPhase.running)
    assert up.endpoint is not None
    url = f"http://{up.endpoint.host}:{up.endpoint.port}/health"
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as response:
            assert response.status == 200
        down = await control.wait_workload(
            "m-se3", "w-oom", lambda w: w.phase is ObservedPhase.failed
        )
        assert down.reason == "CUDA out of memory"
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(url)


async def test_stop_cuts_a_request_still_waiting_for_its_first_byte(serve: Serve) -> None:
    server = await serve(SimEndpoint(latency_ms=600_000))
    url = f"http://{server.host}:{server.port}/v1/completions"
    async with aiohttp.ClientSession() as session:
        waiting = asyncio.create_task(session.post(url, json={"model": MODEL, "prompt": "hi"}))
        await until(lambda: server.requests == 1, what="the request reached the server")
        await asyncio.wait_for(server.stop(), 30)  # not after its ten minutes of latency
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await waiting
