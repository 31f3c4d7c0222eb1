"""A machine joins a running control plane from "elsewhere", serves through its tunnel, and is
cut off by revocation.

Everything real: Solo's control plane in this process (NATS in the accounts layout with the
api's auth callout, the scheduler, the proxy's tunnel hub, the gateway), and a second agent
that joins with `einsora.agent.join` over HTTP, connects to NATS with its own credential, and
dials its tunnel. Its endpoint answers OpenAI's API through the gateway over that tunnel. Not
covered here: a network namespace that refuses inbound connections (see the closing note of
issue 14).
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import tempfile
import time
from pathlib import Path

import openai
import pytest
from tests.conftest import OpenApi, StartPlane

from einsora.agent.join import MachineRevoked, join
from einsora.agent.service import AgentService
from einsora.api.testing import eventually
from einsora.common import simtext
from einsora.common.bus import close_quietly, connect
from einsora.common.errors import BusUnavailable
from einsora.common.settings import Settings
from einsora.common.testing import self_signed_certificate, until

PROMPT = "Where does this machine live?"


async def test_a_joined_machine_serves_through_its_tunnel_until_revoked(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The control plane's own machine has no GPU: the endpoint can only land on the joiner.
    # A short sockets dir: a unix socket's path has at most 107 bytes, and pytest's are long.
    sockets = Path(tempfile.mkdtemp(prefix="einsora-t"))
    plane = await start_plane(
        driver="sim",
        sim_inventory="8 cpu, 32 GiB",
        settings={"tunnel_sockets_dir": sockets},
    )
    api = await api_of(plane)
    token = await api.ok("POST", "/v1/machines/join-tokens", {"region": "local"})
    assert token["tunnel"] is True

    data_dir = tmp_path / "joiner"
    enrolled = await join(data_dir, api.base, token["token"])
    again = await api.call(
        "POST", "/v1/machines/join", {"token": token["token"], "hostname": "second"}
    )
    assert again[0] == 401  # single use
    joiner = AgentService(
        Settings(data_dir=data_dir, log_format="text"),
        driver="sim",
        enrolment=enrolled,
        sim_inventory="1x l40s-48gb, 16 cpu, 64 GiB",
        heartbeat_s=1.0,
    )
    await joiner.start()
    try:
        machines = {m["id"]: m for m in (await api.ok("GET", "/v1/machines"))["items"]}
        owner = machines[plane.agent.machine_id]["enrolment"]["owner_tenant_id"]  # type: ignore[union-attr]
        assert machines[enrolled.machine_id]["enrolment"]["owner_tenant_id"] == owner
        assert machines[enrolled.machine_id]["region"] == "local"

        spec = {"runtime": "llamacpp", "model": "/models/never-read.gguf"}
        body = {"kind": "endpoint", "class": "l40s-48gb", "name": "far", "spec": spec}
        made = await api.ok("POST", "/v1/workloads", body)
        running = await api.wait_state(made["id"], "running")
        assert running["placement"]["machine"] == enrolled.machine_id

        key = await api.ok("POST", "/v1/gateway/keys", {"name": "app"})
        gateway = plane.gateway
        assert gateway is not None
        await until(lambda: key["id"] in gateway.keys, what="the key reached the gateway")
        tenant = made["tenant_id"]
        await until(lambda: gateway.models.replicas(tenant, "far"), what="routed")
        [route] = gateway.models.replicas(tenant, "far")
        assert route.via_tunnel
        hub = plane.proxy.hub if plane.proxy is not None else None
        assert hub is not None
        # The agent dialed before the hub had read the enrolments (in Solo the api provisions
        # the bucket after the proxy starts): refused once, it dials again with back-off.
        await until(lambda: hub.connected(enrolled.machine_id), within_s=30, what="tunnel up")
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key=key["key"], max_retries=0
        )
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": PROMPT}
        ]
        answer = await client.chat.completions.create(model="far", messages=messages, max_tokens=3)
        assert answer.choices[0].message.content == simtext.answer(PROMPT, 3)

        # Revoked: the bus connection is cut, its workload fails with the reason, and the agent
        # hears it is revoked and stops for good.
        revoked_at = time.monotonic()
        await api.ok("DELETE", f"/v1/machines/{enrolled.machine_id}")
        await api.wait_state(made["id"], "failed")
        events = (await api.ok("GET", f"/v1/workloads/{made['id']}/events"))["items"]
        assert events[-1]["reason"].startswith(f"machine revoked: {enrolled.machine_id}")
        gone = await joiner.wait_gone()
        print(f"revoked → agent stopped in {time.monotonic() - revoked_at:.3f} s")
        assert isinstance(gone, MachineRevoked)
        await until(lambda: not gateway.models.replicas(tenant, "far"), what="unrouted")
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="far", messages=messages)
        await client.close()
    finally:
        await joiner.stop_workloads()
        await joiner.stop()
        shutil.rmtree(sockets, ignore_errors=True)


async def test_a_solo_over_tls_runs_and_its_joiners_trust_its_certificate(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path / "tls")
    plane = await start_plane(driver="sim", settings={"nats_tls_cert": cert, "nats_tls_key": key})
    api = await api_of(plane)
    assert plane.settings.effective_nats_url.startswith("tls://")
    # Every service and Solo's own agent talk to NATS over TLS: a launch goes all the way.
    made = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    await api.wait_state(made["id"], "running")
    # A client that does not trust the certificate is refused.
    with pytest.raises((ssl.SSLError, OSError, BusUnavailable)):
        await connect(
            plane.settings.effective_nats_url,
            name="stranger",
            tls=ssl.create_default_context(),
            startup_timeout=2.0,
        )

    token = await api.ok("POST", "/v1/machines/join-tokens", {"tunnel": False})
    assert token["tls_fingerprint"].startswith("sha256:")
    enrolled = await join(tmp_path / "joiner", api.base, token["token"])
    assert enrolled.nats_url.startswith("tls://")
    assert enrolled.nats_ca_pem == cert.read_text()
    joiner = AgentService(
        Settings(data_dir=tmp_path / "joiner", log_format="text"),
        driver="sim",
        enrolment=enrolled,
        heartbeat_s=1.0,
    )
    await joiner.start()  # connected over TLS with the certificate from its enrolment
    try:

        async def reported() -> bool:
            listed = (await api.ok("GET", "/v1/machines"))["items"]
            return any(m["id"] == enrolled.machine_id and m["heartbeat_at"] for m in listed)

        await eventually(reported, within_s=20)
    finally:
        await joiner.stop()


async def test_a_revoked_machine_whose_bus_connection_was_not_cut_stops_when_its_tunnel_is_refused(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The kick that cuts a revoked machine off the bus can be lost (the api's system connection
    # down, a server too busy to answer): the agent must still learn it, from its tunnel.
    sockets = Path(tempfile.mkdtemp(prefix="einsora-t"))
    plane = await start_plane(driver="sim", settings={"tunnel_sockets_dir": sockets})
    api = await api_of(plane)
    token = await api.ok("POST", "/v1/machines/join-tokens", {})
    data_dir = tmp_path / "joiner"
    enrolled = await join(data_dir, api.base, token["token"])
    joiner = AgentService(
        Settings(data_dir=data_dir, log_format="text"),
        driver="sim",
        enrolment=enrolled,
        heartbeat_s=1.0,
    )
    await joiner.start()
    try:
        hub = plane.proxy.hub if plane.proxy is not None else None
        assert hub is not None
        await until(lambda: hub.connected(enrolled.machine_id), within_s=30, what="tunnel up")
        bus_auth = plane.api.bus_auth if plane.api is not None else None
        assert bus_auth is not None
        await close_quietly(bus_auth._system_nc)  # the kick is lost

        revoked_at = time.monotonic()
        await api.ok("DELETE", f"/v1/machines/{enrolled.machine_id}")
        gone = await asyncio.wait_for(joiner.wait_gone(), 30)
        print(f"revoked → agent stopped in {time.monotonic() - revoked_at:.3f} s")
        assert isinstance(gone, MachineRevoked)
        messages = [r.getMessage() for r in caplog.records]
        assert "kick failed" in messages
        assert "tunnel refused by the control plane: this machine's key is not enrolled" in messages
        assert "NATS closed the agent's connection; connecting again" not in messages
    finally:
        await joiner.stop()
        shutil.rmtree(sockets, ignore_errors=True)
