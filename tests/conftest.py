"""Fixtures for cross-service tests: the whole control plane in this process, on free ports.

`start_plane()` runs what Solo runs (embedded NATS, api, scheduler, proxy and an agent) in a
temporary data dir, with short heartbeat and poll intervals; `Api` is a small HTTP client of it
that authenticates as the owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest
import pytest_asyncio

from einsora.agent.service import DriverName
from einsora.cli.controlplane import ControlPlane
from einsora.common.settings import Settings

WAIT_S = 60.0

STOP_WORKLOADS_S = 60.0
"""How long a plane's agent may take to stop its workloads at a test's end: past it, the test
fails saying where each workload stands, rather than hanging until pytest's timeout."""


class StartPlane(Protocol):
    async def __call__(
        self,
        *,
        driver: DriverName = "sim",
        settings: Mapping[str, Any] | None = None,
        **agent_options: Any,
    ) -> ControlPlane: ...


@pytest_asyncio.fixture
async def start_plane(tmp_path: Path) -> AsyncIterator[StartPlane]:
    planes: list[ControlPlane] = []

    async def start(
        *,
        driver: DriverName = "sim",
        settings: Mapping[str, Any] | None = None,
        **agent_options: Any,
    ) -> ControlPlane:
        """`settings` overrides the plane's Settings (e.g. `proxy_domain`)."""
        agent_options.setdefault("heartbeat_s", 1.0)
        agent_options.setdefault("poll_s", 0.2)
        agent_options.setdefault("grace_s", 3.0)
        fields: dict[str, Any] = {
            "data_dir": tmp_path / f"plane{len(planes)}",
            "api_port": 0,
            "proxy_port": 0,
            "gateway_port": 0,
            "nats_port": 0,
            "log_format": "text",
            **(settings or {}),
        }
        plane = ControlPlane(Settings(**fields), agent_driver=driver, agent_options=agent_options)
        planes.append(plane)
        await plane.start()
        return plane

    yield start
    for plane in reversed(planes):
        try:
            if plane.agent is not None:
                try:
                    await asyncio.wait_for(plane.agent.stop_workloads(), STOP_WORKLOADS_S)
                except TimeoutError:
                    pytest.fail(
                        f"the agent's workloads did not stop within {STOP_WORKLOADS_S:g} s: "
                        + "; ".join(plane.agent.unsettled())
                    )
        finally:
            await plane.stop()
            if plane.stuck:
                pytest.fail("services did not stop: " + "\n".join(plane.stuck))


@dataclass
class Api:
    """The owner's HTTP client of a control plane's API."""

    http: aiohttp.ClientSession
    base: str
    token: str

    def _headers(self, extra: dict[str, str] | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **(extra or {})}

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        async with self.http.request(
            method, self.base + path, json=body, headers=self._headers(headers)
        ) as resp:
            data = await resp.json() if resp.content_type == "application/json" else None
            return resp.status, data

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, data = await self.call(method, path, body)
        assert status < 300, (status, data)
        return data

    async def wait_state(self, workload_id: str, *states: str, within_s: float = WAIT_S) -> Any:
        """Poll the workload until it is in one of `states` (fails with its timeline if not)."""
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            workload = await self.ok("GET", f"/v1/workloads/{workload_id}")
            if workload["state"] in states:
                return workload
            if asyncio.get_running_loop().time() > deadline:
                events = await self.ok("GET", f"/v1/workloads/{workload_id}/events")
                raise AssertionError(
                    f"{workload_id} is {workload['state']}, not {states}: {events['items']}"
                )
            await asyncio.sleep(0.1)


async def tenant_admin(owner: Api, name: str) -> tuple[str, Api]:
    """A new tenant `name`, made by the operator, and an Api as its first admin."""
    tenant = await owner.ok("POST", "/v1/tenants", {"name": name})
    invited = await owner.ok(
        "POST",
        f"/v1/tenants/{tenant['id']}/invitations",
        {"username": f"{name}-admin", "role": "admin"},
    )
    status, joined = await owner.call("POST", "/v1/invitations/redeem", {"code": invited["code"]})
    assert status == 201, joined
    return tenant["id"], Api(owner.http, owner.base, joined["token"]["token"])


OpenApi = Callable[[ControlPlane], Awaitable[Api]]


@pytest_asyncio.fixture
async def api_of() -> AsyncIterator[OpenApi]:
    sessions: list[aiohttp.ClientSession] = []

    async def open_api(plane: ControlPlane) -> Api:
        http = aiohttp.ClientSession()
        sessions.append(http)
        token = (plane.settings.data_dir / "owner.token").read_text().strip()
        return Api(http, f"http://127.0.0.1:{plane.api_port}", token)

    yield open_api
    for http in sessions:
        await http.close()
