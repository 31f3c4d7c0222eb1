"""An endpoint in a container of a real Docker Engine (the engine tier): launched through the
api with `spec.image`, placed on the docker driver, it answers OpenAI's API through the gateway;
parked, its container goes and its volume stays, so the resumed container finds what the first
one wrote there.

The image is the stub's (busybox, the host's Python and a stdlib OpenAI-compatible server),
imported from a local rootfs tarball: no registry. Everything else real, in this process.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest
from tests.conftest import OpenApi, StartPlane

from einsora.agent.drivers.container.driver import client as docker_client
from einsora.common.testing import until
from einsora.testing.pytest_engines import DockerEngine

pytestmark = pytest.mark.engines

START_S = 60.0


def _starts(url: str, workload_id: str) -> str:
    """What the workload's volume says of its starts (read through a throwaway container)."""
    docker = docker_client(url, 60)
    try:
        container = docker.containers.get(f"einsora-{workload_id}")
        code, out = container.exec_run(["/bin/cat", "/data/starts"])
        assert code == 0, out
        return str(out.decode())
    finally:
        docker.close()


def _volumes(url: str, workload_id: str) -> list[str]:
    docker = docker_client(url, 60)
    try:
        return [v.name for v in docker.volumes.list(filters={"name": f"einsora-{workload_id}"})]
    finally:
        docker.close()


async def test_an_endpoint_in_a_container_answers_through_the_gateway_and_keeps_its_volume(
    docker_engine: DockerEngine, start_plane: StartPlane, api_of: OpenApi
) -> None:
    plane = await start_plane(driver="process", engines=docker_engine.options())
    api = await api_of(plane)
    rootfs = docker_engine.rootfs
    spec: dict[str, Any] = {
        "runtime": "command",
        "image": rootfs.tag,
        "command": [
            "/bin/sh",
            "-c",
            f"echo started >> /data/starts && exec {rootfs.python} {rootfs.stub} $PORT",
        ],
        "readiness_path": "/health",
    }
    made = await api.ok(
        "POST",
        "/v1/workloads",
        {"kind": "endpoint", "class": "cpu-1c-2g", "name": "boxed", "spec": spec},
    )
    running = await api.wait_state(made["id"], "running", within_s=START_S)
    events = (await api.ok("GET", f"/v1/workloads/{made['id']}/events"))["items"]
    scheduled = next(e for e in events if e["state"] == "scheduled")
    assert (
        "; driver docker: a container image runs in a container (weak isolation"
        in (scheduled["reason"])
    )
    assert running["placement"] is not None

    created = await api.ok("POST", "/v1/gateway/keys", {"name": "app"})
    gateway = plane.gateway
    assert gateway is not None
    await until(lambda: created["id"] in gateway.keys, what="the key reached the gateway")
    await until(lambda: bool(gateway.models.replicas(made["tenant_id"], "boxed")), what="routed")
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key=created["key"], max_retries=0
    )
    answer = await client.chat.completions.create(
        model="boxed", messages=[{"role": "user", "content": "one two three"}]
    )
    assert answer.choices[0].message.content == "3 words, from a container"
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == 3
    await client.close()
    assert _starts(docker_engine.url, made["id"]) == "started\n"

    await api.ok("POST", f"/v1/workloads/{made['id']}/park")
    await api.wait_state(made["id"], "parked", within_s=START_S)
    events = (await api.ok("GET", f"/v1/workloads/{made['id']}/events"))["items"]
    parked = [e for e in events if e["state"] == "parked"][-1]
    assert f"its volume einsora-{made['id']} is kept" in parked["reason"]
    assert _volumes(docker_engine.url, made["id"]) == [f"einsora-{made['id']}"]

    await api.ok("POST", f"/v1/workloads/{made['id']}/resume")
    await api.wait_state(made["id"], "running", within_s=START_S)
    assert _starts(docker_engine.url, made["id"]) == "started\nstarted\n"

    await api.ok("DELETE", f"/v1/workloads/{made['id']}")
    await api.wait_state(made["id"], "removed", within_s=START_S)
    assert _volumes(docker_engine.url, made["id"]) == []


async def test_a_notebook_in_a_container_opens_through_the_proxy_with_its_own_token(
    docker_engine: DockerEngine, start_plane: StartPlane, api_of: OpenApi
) -> None:
    if docker_engine.notebook is None:
        pytest.skip(docker_engine.why_no_notebook)
    plane = await start_plane(driver="process", engines=docker_engine.options())
    api = await api_of(plane)
    spec = {"image": docker_engine.notebook.tag}
    made = await api.ok(
        "POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g", "spec": spec}
    )
    await api.wait_state(made["id"], "running", within_s=START_S)
    assert plane.proxy is not None
    port = plane.proxy.port
    host = f"{made['id']}.localhost:{port}"
    access = await api.ok("POST", f"/v1/workloads/{made['id']}/access")
    url = urlsplit(access["url"])
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.get(
            f"http://127.0.0.1:{port}{url.path}?{url.query}",
            headers={"Host": host},
            allow_redirects=False,
        ) as entered:
            assert entered.status == 303
            cookie = f"einsora-site={entered.cookies['einsora-site'].value}"
        # Jupyter in the container answers only with its token, which the proxy adds.
        async with http.get(
            f"http://127.0.0.1:{port}/api/status", headers={"Host": host, "Cookie": cookie}
        ) as status:
            assert status.status == 200, await status.text()
            assert "started" in await status.json()
    await api.ok("DELETE", f"/v1/workloads/{made['id']}")
    await api.wait_state(made["id"], "removed", within_s=START_S)
