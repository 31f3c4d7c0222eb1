"""A gateway harness for tests: the real service, and helpers that act as the api and scheduler.

Keys and routes are written to KV the way the api and the scheduler write them, and the gateway
learns them through its mirrors as in production. Upstreams are started by a factory the tests
pass in (the agent's sim endpoint, which this package may not import), so any OpenAI-compatible
server can stand behind a route. It needs the `openai` SDK (a dev dependency), so only tests
import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import openai
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from einsora.common.bus import names
from einsora.common.ids import new_id
from einsora.common.schemas import (
    GatewayKey,
    ModelFallback,
    Route,
    SimEndpoint,
    TokenUsage,
    WorkloadKind,
)
from einsora.common.settings import Settings
from einsora.common.testing import until
from einsora.gateway.service import GatewayService

PINNED_NOW = 1_800_000_030.5
"""A pinned gateway clock: 30.5 s into a Unix minute, so a test's rate-limit window stays one."""
WAIT_S = 15.0


class Upstream(Protocol):
    """A started OpenAI-compatible server (the sim endpoint in these tests)."""

    port: int
    requests: int

    async def stop(self) -> None: ...


StartUpstream = Callable[[str, SimEndpoint | None], Awaitable[Upstream]]
"""Starts a server for a model with the given behaviour; returns it started."""


@dataclass
class Replica:
    """A running upstream for one model, and its route."""

    server: Upstream
    route: Route


def gateway_settings(nats_url: str, data_dir: Path) -> Settings:
    return Settings(nats_url=nats_url, gateway_port=0, data_dir=data_dir, log_format="text")


@dataclass
class Harness:
    """A test's tenant, its gateways and upstreams, and the api's and scheduler's parts."""

    js: JetStreamContext
    """A JetStream context with every right (the test's own client)."""
    nats_url: str
    data_dir: Path
    start_upstream: StartUpstream
    gateways: list[GatewayService] = field(default_factory=list)
    tenant: str = field(default_factory=lambda: new_id("tenant"))
    servers: list[Upstream] = field(default_factory=list)

    @property
    def gateway(self) -> GatewayService:
        return self.gateways[0]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}/v1"

    async def start_gateway(self, clock: Callable[[], float] | None = None) -> GatewayService:
        gateway = GatewayService(gateway_settings(self.nats_url, self.data_dir), clock=clock)
        await gateway.start()
        self.gateways.append(gateway)
        return gateway

    async def close(self) -> None:
        for gateway in self.gateways:
            await gateway.stop()
        for server in self.servers:
            await server.stop()

    async def key(self, **fields: Any) -> tuple[str, GatewayKey]:
        """A new key of the tenant (the api's part: only its hash is published)."""
        secret = "esk_" + secrets.token_urlsafe(32)
        key = GatewayKey(
            key_id=new_id("gateway_key"),
            tenant_id=fields.pop("tenant_id", self.tenant),
            user_id="u-test",
            name="test key",
            key_hash=hashlib.sha256(secret.encode()).hexdigest(),
            **fields,
        )
        kv = await self.js.key_value(names.GATEWAY_KEYS.name)
        await kv.put(names.gateway_key_key(key.key_id), key.to_bytes())
        await until(
            lambda: all(key.key_id in g.keys for g in self.gateways),
            what="the gateways know the new key",
        )
        return secret, key

    async def revoke(self, key: GatewayKey) -> None:
        kv = await self.js.key_value(names.GATEWAY_KEYS.name)
        await kv.delete(names.gateway_key_key(key.key_id))

    async def replica(
        self, model: str, options: SimEndpoint | None = None, *, runtime: str = "sim"
    ) -> Replica:
        """Start an upstream for `model` and publish its route (the scheduler's part)."""
        server = await self.start_upstream(model, options)
        self.servers.append(server)
        return Replica(server, await self.route(model, server.port, runtime=runtime))

    async def route(
        self, model: str, port: int, *, runtime: str = "sim", wait: bool = True
    ) -> Route:
        """Publish a route of the tenant's `model` to `port` (whatever listens there); `wait`:
        until every gateway routes to it."""
        route = Route(
            workload_id=new_id("workload"),
            tenant_id=self.tenant,
            kind=WorkloadKind.endpoint,
            machine_id="m-test",
            host="127.0.0.1",
            port=port,
            name=model,
            runtime=runtime,
        )
        kv = await self.js.key_value(names.ROUTES.name)
        await kv.put(names.route_key(route.workload_id), route.to_bytes())
        if not wait:
            return route
        await until(
            lambda: all(route in g.models.replicas(self.tenant, model) for g in self.gateways),
            what="the gateways route to the new replica",
        )
        return route

    async def model_fallback(self, model: str, fallback: list[str]) -> None:
        """Publish the endpoint `model`'s model fallbacks (the api's part, ADR-0022)."""
        record = ModelFallback(
            workload_id=new_id("workload"), tenant_id=self.tenant, model=model, fallback=fallback
        )
        kv = await self.js.key_value(names.MODEL_FALLBACKS.name)
        await kv.put(names.model_fallback_key(record.workload_id), record.to_bytes())
        await until(
            lambda: all(
                g.fallbacks.of(self.tenant, model) == tuple(fallback) for g in self.gateways
            ),
            what="the gateways know the model's fallbacks",
        )

    async def unroute(self, route: Route) -> None:
        kv = await self.js.key_value(names.ROUTES.name)
        await kv.delete(names.route_key(route.workload_id))

    def client(self, secret: str, base_url: str | None = None) -> openai.AsyncOpenAI:
        """The `openai` SDK against the gateway, its retries off (so each try is seen)."""
        return openai.AsyncOpenAI(
            base_url=base_url or self.base_url, api_key=secret, max_retries=0, timeout=30
        )

    async def counters(self, key: GatewayKey, now: float) -> dict[str, int] | None:
        """The key's shared rate-limit counters in the minute of `now` (None: none yet)."""
        kv = await self.js.key_value(names.GATEWAY_LIMITS.name)
        try:
            entry = await kv.get(names.gateway_limit_key(key.key_id, int(now // 60)))
        except KeyNotFoundError:
            return None
        value: dict[str, int] = json.loads(entry.value or b"{}")
        return value

    async def usage(self, count: int, *, within_s: float = WAIT_S) -> list[TokenUsage]:
        """The tenant's first `count` usage messages, read from the USAGE stream."""
        sub = await self.js.pull_subscribe(
            names.usage_tokens_subject(self.tenant), stream=names.USAGE.name
        )
        got: list[TokenUsage] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        try:
            while len(got) < count:
                left = deadline - loop.time()
                if left <= 0:
                    raise AssertionError(f"{len(got)} usage messages, not {count}")
                with contextlib.suppress(TimeoutError):
                    for msg in await sub.fetch(count - len(got), timeout=min(left, 1.0)):
                        got.append(TokenUsage.from_bytes(msg.data))
                        await msg.ack()
        finally:
            await sub.unsubscribe()
        return got


@contextlib.asynccontextmanager
async def harness(
    js: JetStreamContext,
    nats_url: str,
    data_dir: Path,
    start_upstream: StartUpstream,
    clock: Callable[[], float] | None,
) -> AsyncIterator[Harness]:
    """A harness with one gateway started on `clock` (None: the real one)."""
    made = Harness(js, nats_url, data_dir, start_upstream)
    try:
        await made.start_gateway(clock)
        yield made
    finally:
        await made.close()
