"""Accounting works under its own bus identity, with nothing more (ADR-0009).

A real nats-server runs with the users Solo writes: the api provisions the bus and asks for
reports, the scheduler publishes workload events and reads KV `usage`, the gateway publishes
token counts; accounting, connected as `accounting`, must still consume both streams, write
each tenant's usage and answer reports. A permission missing from its template shows up here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError

from einsora.accounting.service import AccountingService
from einsora.accounting.testing import (
    T0,
    GatewayPlayer,
    SchedulerPlayer,
    ask_report,
    held,
    hours,
)
from einsora.common.bus import bind_bucket, connect_as, identities, names, provision
from einsora.common.bus.provision import ALL_BUT_ROUTES
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import ReportGroup, TenantUsage, UsageItem, UsageReportRequest
from einsora.common.settings import Settings

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
    """The api, scheduler and gateway, each connected as itself."""
    made = {
        name: await connect_as(locked_bus.server.url, name, locked_bus.credentials)
        for name in USERS
        if name != identities.ACCOUNTING
    }
    try:
        yield made
    finally:
        for nc in made.values():
            await nc.close()


async def test_accounting_meters_publishes_and_reports_under_its_own_identity(
    locked_bus: LockedBus, peers: dict[str, NATS], tmp_path: Path, sqlite_url: str
) -> None:
    api = peers[identities.API]
    await provision(api.jetstream(), only=ALL_BUT_ROUTES)
    settings = Settings(
        nats_url=locked_bus.server.url,
        nats_credentials_dir=locked_bus.credentials,
        database_url=sqlite_url,
        data_dir=tmp_path,
    )
    accounting = AccountingService(settings, publish_debounce_s=0.05, clock=lambda: T0 + hours(2))
    await accounting.start()
    try:
        scheduler = SchedulerPlayer(peers[identities.SCHEDULER].jetstream())
        gateway = GatewayPlayer(peers[identities.GATEWAY].jetstream())
        await scheduler.run_for(
            new_id("workload"), T0, T0 + hours(1), tenant_id="t-l", metered=held(2)
        )
        await gateway.send(gateway.usage(T0, tenant_id="t-l", prompt=3, completion=4))

        request = UsageReportRequest.model_validate(
            {"group_by": ReportGroup.tenant, "from": T0, "to": T0 + hours(2), "now": T0 + hours(2)}
        )
        want = [
            UsageItem(
                group="t-l", gpu_hours=2.0, cpu_core_hours=8.0, prompt_tokens=3, completion_tokens=4
            )
        ]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while (reply := await ask_report(api, request)).items != want:
            assert reply.error is None
            assert loop.time() < deadline, f"the report stayed {reply}"
            await asyncio.sleep(0.05)

        # The scheduler reads what accounting wrote.
        kv = bind_bucket(peers[identities.SCHEDULER].jetstream(), names.USAGE_KV)
        deadline = loop.time() + 15
        while True:
            try:
                entry = await kv.get(names.tenant_usage_key("t-l"))
                break
            except KeyNotFoundError:
                assert loop.time() < deadline, "accounting wrote no usage for t-l"
                await asyncio.sleep(0.05)
        assert entry.value is not None
        assert TenantUsage.from_bytes(entry.value).tenant_id == "t-l"
    finally:
        await accounting.stop()
