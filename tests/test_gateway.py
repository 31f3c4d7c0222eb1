"""An endpoint launched through the API answers OpenAI's API through the gateway.

Everything real: the api, the scheduler, the gateway and a sim agent (its endpoints answer the
OpenAI API themselves) in this process, over an embedded nats-server; the client is the
`openai` SDK, unchanged.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from tests.conftest import OpenApi, StartPlane

from einsora.cli.controlplane import ControlPlane
from einsora.common import simtext
from einsora.common.testing import until

PROMPT = "What is the capital of France?"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]


def _client(plane: ControlPlane, key: str) -> openai.AsyncOpenAI:
    assert plane.gateway is not None
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{plane.gateway.port}/v1", api_key=key, max_retries=0
    )


async def test_an_endpoint_with_replicas_serves_through_the_gateway_until_parked(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="sim", sim_machines=2, sim_inventory="8 cpu, 32 GiB")
    api = await api_of(plane)
    spec = {"runtime": "llamacpp", "model": "/models/never-read.gguf", "replicas": 2}
    body = {"kind": "endpoint", "class": "cpu-1c-2g", "name": "chat", "spec": spec}
    made = await api.ok("POST", "/v1/workloads", body)
    listed = await api.ok("GET", "/v1/workloads?kind=endpoint")
    replicas = [w["id"] for w in listed["items"]]
    assert made["id"] in replicas
    assert len(replicas) == 2
    placed = [await api.wait_state(w, "running") for w in replicas]
    # Apart: one replica on each machine.
    assert len({w["placement"]["machine"] for w in placed}) == 2

    created = await api.ok("POST", "/v1/gateway/keys", {"name": "app"})
    made_id = created["id"]
    client = _client(plane, created["key"])
    gateway = plane.gateway
    assert gateway is not None
    tenant = made["tenant_id"]
    await until(lambda: len(gateway.models.replicas(tenant, "chat")) == 2, what="both routed")
    await until(lambda: made_id in gateway.keys, what="the key reached the gateway")
    models = await client.models.list()
    assert [m.id for m in models.data] == ["chat"]
    answer = await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=5)
    assert answer.choices[0].message.content == simtext.answer(PROMPT, 5)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == simtext.chat_prompt_tokens(MESSAGES)
    assert answer.usage.completion_tokens == 5
    streamed = await client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=4, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
    assert text == simtext.answer(PROMPT, 4)

    # Parked: the routes go at once, so the gateway stops sending it requests before it stops.
    await api.ok("POST", f"/v1/workloads/{made['id']}/park")
    await until(lambda: not gateway.models.replicas(tenant, "chat"), within_s=5, what="unrouted")
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    await client.close()


async def test_a_revoked_gateway_key_is_refused_within_a_second(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="sim")
    api = await api_of(plane)
    made = await api.ok("POST", "/v1/gateway/keys", {"name": "short-lived"})
    made_id = made["id"]
    client = _client(plane, made["key"])
    gateway = plane.gateway
    assert gateway is not None
    # The key reaches the gateway through KV (the api put it there before answering).
    await until(lambda: made_id in gateway.keys, what="the key reached the gateway")
    await client.models.list()
    await api.ok("DELETE", f"/v1/gateway/keys/{made['id']}")
    loop = asyncio.get_running_loop()
    revoked_at = loop.time()
    while True:
        try:
            await client.models.list()
        except openai.AuthenticationError:
            break
        assert loop.time() - revoked_at < 1.0, "the revoked key still worked after 1 s"
        await asyncio.sleep(0.01)
    await client.close()
