"""The gateway works under its own bus identity, with nothing more (ADR-0009).

A real nats-server runs with exactly the users Solo writes: the api publishes keys, the
scheduler routes, accounting reads usage, and the gateway, connected as `gateway`, must still
mirror both buckets, keep its limits bucket (creating it, then compare-and-set), and publish
usage. A permission missing from its template shows up here as a request that fails.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from einsora.agent.runtimes.sim_server import SimEndpointServer
from einsora.common.bus import bind_bucket, connect_as, identities, names, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import GatewayKey, Route, TokenUsage, WorkloadKind
from einsora.common.settings import Settings
from einsora.common.testing import until
from einsora.gateway.service import GatewayService
from einsora.gateway.testing import PINNED_NOW

SECRET = "esk_" + "k" * 43
USERS = (identities.API, identities.SCHEDULER, identities.ACCOUNTING, identities.GATEWAY)


@dataclass
class LockedBus:
    server: EmbeddedNats
    credentials: Path


@pytest.fixture
def locked_bus(tmp_path: Path) -> Iterator[LockedBus]:
    credentials = tmp_path / "bus"
    users = {
        name: (identities.ensure_identity(credentials, name), identities.service_permissions(name))
        for name in USERS
    }
    server = EmbeddedNats(
        tmp_path / "nats", port=0, authorization=identities.authorization_conf(users)
    )
    server.start()
    try:
        yield LockedBus(server, credentials)
    finally:
        server.stop()


@pytest_asyncio.fixture
async def peers(locked_bus: LockedBus) -> AsyncIterator[dict[str, NATS]]:
    """The api, scheduler and accounting, each connected as itself."""
    made = {
        name: await connect_as(locked_bus.server.url, name, locked_bus.credentials)
        for name in USERS
        if name != identities.GATEWAY
    }
    try:
        yield made
    finally:
        for nc in made.values():
            await nc.close()


async def test_the_gateway_serves_limits_and_counts_under_its_own_identity(
    locked_bus: LockedBus, peers: dict[str, NATS], tmp_path: Path
) -> None:
    api, scheduler = peers[identities.API].jetstream(), peers[identities.SCHEDULER].jetstream()
    # Each provisions what it owns; the limits bucket is left for the gateway to create.
    await provision(api, only=(names.USAGE.name, names.GATEWAY_KEYS.stream))
    await provision(scheduler, only=(names.ROUTES.stream,))
    sim = SimEndpointServer("tiny")
    port = await sim.start()
    settings = Settings(
        nats_url=locked_bus.server.url,
        nats_credentials_dir=locked_bus.credentials,
        gateway_port=0,
        data_dir=tmp_path,
    )
    gateway = GatewayService(settings, clock=lambda: PINNED_NOW)
    await gateway.start()
    try:
        key = GatewayKey(
            key_id=new_id("gateway_key"),
            tenant_id="t-1",
            user_id="u-1",
            name="locked",
            key_hash=hashlib.sha256(SECRET.encode()).hexdigest(),
            rpm=3,
            tpm=10_000,
        )
        await bind_bucket(api, names.GATEWAY_KEYS).put(key.key_id, key.to_bytes())
        route = Route(
            workload_id=new_id("workload"),
            tenant_id="t-1",
            kind=WorkloadKind.endpoint,
            machine_id="m-1",
            host="127.0.0.1",
            port=port,
            name="tiny",
            runtime="sim",
        )
        await bind_bucket(scheduler, names.ROUTES).put(route.workload_id, route.to_bytes())
        await until(lambda: key.key_id in gateway.keys and gateway.models.replicas("t-1", "tiny"))

        base_url = f"http://127.0.0.1:{gateway.port}/v1"
        async with openai.AsyncOpenAI(base_url=base_url, api_key=SECRET, max_retries=0) as client:
            for _ in range(3):
                await client.completions.create(model="tiny", prompt="hello", max_tokens=2)
            with pytest.raises(openai.RateLimitError):
                await client.completions.create(model="tiny", prompt="hello", max_tokens=2)

        sub = (
            await peers[identities.ACCOUNTING]
            .jetstream()
            .pull_subscribe(names.usage_tokens_subject("t-1"), stream=names.USAGE.name)
        )
        messages = await sub.fetch(3, timeout=10)
        usages = [TokenUsage.from_bytes(m.data) for m in messages]
        assert [u.completion_tokens for u in usages] == [2, 2, 2]
        await sub.unsubscribe()
    finally:
        await gateway.stop()
        await sim.stop()
