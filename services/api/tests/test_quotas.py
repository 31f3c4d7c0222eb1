"""Tenant quotas: set by the operator only, stored and put on the bus before the answer, read
back with the tenant's use; and the `quota.*` keys of KV `usage` put right by the sync whatever
was done to them, without touching accounting's keys."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from einsora.api.projections.quotas import QuotasSync
from einsora.api.testing import (
    Answer,
    Client,
    RunningApi,
    eventually,
    new_member,
    new_tenant,
    running_api,
)
from einsora.common.bus import connect, identities, names
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.schemas import TenantQuota, TenantUsage
from einsora.common.settings import Settings
from einsora.common.testing import Bus, until

FULL = {"max_gpus": {"l40s-48gb": 4, "h100-80gb": 2}, "max_gpus_total": 8, "gpu_hours_per_7d": 100}


def _path(tenant_id: str) -> str:
    return f"/v1/tenants/{tenant_id}/quota"


async def _put(client: Client, tenant_id: str, body: Any) -> Answer:
    return await client.call("PUT", _path(tenant_id), body)


async def _bucket(bus: Bus) -> KeyValue:
    return await bus.js.key_value(names.USAGE_KV.name)


async def _on_bus(bus: Bus, tenant_id: str) -> TenantQuota | None:
    """What the scheduler would read of this tenant's quota now (None: nothing)."""
    try:
        entry = await (await _bucket(bus)).get(names.tenant_quota_key(tenant_id))
    except KeyNotFoundError:
        return None
    return TenantQuota.from_bytes(entry.value or b"")


async def _rows(api: RunningApi) -> list[dict[str, Any]]:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        rows = (await conn.execute(sa.text("SELECT * FROM tenant_quotas"))).mappings().all()
    return [dict(r) for r in rows]


async def _sync(api: RunningApi) -> QuotasSync:
    """The api's sync once its first pass is done: a test's passes are then the only ones."""
    sync = api.service.quotas
    assert sync is not None
    await until(lambda: sync.passes >= 1, what="the first pass of the quotas sync")
    return sync


async def test_the_operator_sets_a_quota_the_scheduler_reads_before_the_answer(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    tenant_id, admin = await new_tenant(api, "physics", "ann")
    member = await new_member(api, tenant_id, "bob", by=admin)

    put = await _put(api.owner, tenant_id, FULL)
    assert put.status == 200, put.text
    assert put.body["tenant_id"] == tenant_id
    quota = put.body["quota"]
    assert quota["max_gpus"] == {"h100-80gb": 2, "l40s-48gb": 4}
    assert (quota["max_gpus_total"], quota["gpu_hours_per_7d"]) == (8, 100)
    assert quota["updated_at"] is not None
    assert put.body["use"] == {"gpus": {}, "gpus_total": 0, "gpu_hours_7d": 0.0, "at": None}
    assert await _on_bus(bus, tenant_id) == TenantQuota(
        tenant_id=tenant_id,
        max_gpus={"h100-80gb": 2, "l40s-48gb": 4},
        max_gpus_total=8,
        gpu_hours_per_7d=100,
    )

    # The tenant's own members read it, with the use accounting last published.
    usage = TenantUsage(
        tenant_id=tenant_id, gpu_hours_7d=12.5, open_gpus={"l40s-48gb": 3, "h100-80gb": 1}
    )
    await (await _bucket(bus)).put(names.tenant_usage_key(tenant_id), usage.to_bytes())
    for reader in (api.owner, admin, member):
        got = await reader.get(_path(tenant_id))
        assert got.status == 200, got.text
        assert got.body["quota"] == quota
        use = got.body["use"]
        assert use["gpus"] == {"h100-80gb": 1, "l40s-48gb": 3}
        assert (use["gpus_total"], use["gpu_hours_7d"]) == (4, 12.5)
        assert use["at"] is not None

    # A tenant with no quota shows none, and nothing of it is on the bus.
    other, _ = await new_tenant(api, "chemistry", "cat")
    got = await api.owner.get(_path(other))
    assert got.body["quota"] == {
        "max_gpus": {},
        "max_gpus_total": None,
        "gpu_hours_per_7d": None,
        "updated_at": None,
    }
    assert await _on_bus(bus, other) is None


async def test_a_put_replaces_the_quota_and_null_clears_a_part(api: RunningApi, bus: Bus) -> None:
    tenant_id, _ = await new_tenant(api, "physics", "ann")
    assert (await _put(api.owner, tenant_id, FULL)).status == 200
    put = await _put(api.owner, tenant_id, {"max_gpus": {"l40s-48gb": 1}, "max_gpus_total": None})
    assert put.status == 200, put.text
    assert put.body["quota"]["max_gpus"] == {"l40s-48gb": 1}
    assert put.body["quota"]["max_gpus_total"] is None
    assert put.body["quota"]["gpu_hours_per_7d"] is None
    assert await _on_bus(bus, tenant_id) == TenantQuota(
        tenant_id=tenant_id, max_gpus={"l40s-48gb": 1}
    )
    cleared = await _put(api.owner, tenant_id, {})
    assert cleared.status == 200
    assert await _on_bus(bus, tenant_id) == TenantQuota(tenant_id=tenant_id)
    assert len(await _rows(api)) == 1


async def test_only_the_operator_sets_a_quota(api: RunningApi, bus: Bus) -> None:
    tenant_id, admin = await new_tenant(api, "physics", "ann")
    member = await new_member(api, tenant_id, "bob", by=admin)
    other, other_admin = await new_tenant(api, "chemistry", "cat")
    for client in (admin, member):
        refused = await _put(client, tenant_id, FULL)
        assert refused.status == 403, refused.text
        assert refused.body["error"] == "forbidden"
        assert "operator" in refused.body["message"]
        hidden = await _put(client, other, FULL)
        assert hidden.status == 404
        assert (await client.get(_path(other))).status == 404
    assert (await other_admin.get(_path(tenant_id))).status == 404
    assert await _rows(api) == []
    assert await _on_bus(bus, tenant_id) is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_gpus": {"l40s-48gb": 1, "k80-12gb": 2}}, "max_gpus.k80-12gb"),
        ({"max_gpus": {"cpu-4c-16g": 1}}, "max_gpus.cpu-4c-16g"),
        ({"max_gpus": {"l40s-48gb": -1}}, "max_gpus.l40s-48gb"),
        ({"max_gpus": {"l40s-48gb": "4"}}, "max_gpus.l40s-48gb"),
        ({"max_gpus_total": -1}, "max_gpus_total"),
        ({"max_gpus_total": 1.5}, "max_gpus_total"),
        ({"gpu_hours_per_7d": -0.5}, "gpu_hours_per_7d"),
        ({"gpu_hours_per_7d": "100"}, "gpu_hours_per_7d"),
        ({"max_gpu_total": 8}, "max_gpu_total"),
    ],
    ids=[
        "unknown-class",
        "cpu-class",
        "negative-devices",
        "string-devices",
        "negative-total",
        "fraction-total",
        "negative-hours",
        "string-hours",
        "typo",
    ],
)
async def test_a_bad_quota_is_refused_naming_the_field(
    shared_api: RunningApi, body: dict[str, Any], field: str
) -> None:
    tenant = (await shared_api.owner.get("/v1/me")).body["tenant"]["id"]
    before = await shared_api.owner.get(_path(tenant))
    answer = await _put(shared_api.owner, tenant, body)
    assert answer.status == 422, answer.text
    assert answer.body["error"] == "validation_error"
    assert [d["field"] for d in answer.body["details"]] == [field]
    assert field.removeprefix("max_gpus.") in answer.body["message"]
    assert answer.body["request_id"] == answer.request_id
    assert (await shared_api.owner.get(_path(tenant))).body["quota"] == before.body["quota"]


async def test_racing_puts_leave_the_last_stored_on_the_bus(api: RunningApi, bus: Bus) -> None:
    tenant_id, _ = await new_tenant(api, "physics", "ann")
    answers = await asyncio.gather(
        *(_put(api.owner, tenant_id, {"max_gpus_total": n}) for n in range(1, 21))
    )
    assert [a.status for a in answers] == [200] * 20
    [row] = await _rows(api)
    on_bus = await _on_bus(bus, tenant_id)
    assert on_bus is not None
    assert on_bus.max_gpus_total == row["max_gpus_total"]


async def test_the_sync_puts_back_what_is_missing_or_wrong_and_leaves_accountings_keys(
    api: RunningApi, bus: Bus
) -> None:
    sync = await _sync(api)
    kept, _ = await new_tenant(api, "kept", "a1")
    lost, _ = await new_tenant(api, "lost", "a2")
    altered, _ = await new_tenant(api, "altered", "a3")
    for tenant_id in (kept, lost, altered):
        assert (await _put(api.owner, tenant_id, FULL)).status == 200
    expected = {t: await _on_bus(bus, t) for t in (kept, lost, altered)}

    bucket = await _bucket(bus)
    await bucket.delete(names.tenant_quota_key(lost))
    wrong = expected[altered]
    assert wrong is not None
    await bucket.put(
        names.tenant_quota_key(altered), wrong.model_copy(update={"max_gpus_total": 999}).to_bytes()
    )
    stray = names.tenant_quota_key("t-nobody")
    await bucket.put(stray, TenantQuota(tenant_id="t-nobody").to_bytes())
    await bucket.put("quota.garbage", b"not json")
    usage = TenantUsage(tenant_id=kept, gpu_hours_7d=3.0).to_bytes()
    await bucket.put(names.tenant_usage_key(kept), usage)  # accounting's, not the sync's

    report = await sync.run_once()
    assert sorted(report.put) == sorted([lost, altered])
    assert sorted(report.deleted) == sorted([stray, "quota.garbage"])
    for tenant_id, value in expected.items():
        assert await _on_bus(bus, tenant_id) == value
    assert (await bucket.get(names.tenant_usage_key(kept))).value == usage

    again = await sync.run_once()  # nothing left to repair
    assert (again.put, again.deleted) == ((), ())


async def test_an_outage_is_put_right_once_the_bus_is_back(
    own_nats_server: EmbeddedNats, sqlite_url: str, data_dir: Path
) -> None:
    """With NATS down a PUT is stored but answers 503 saying the scheduler was not told, and a
    GET cannot show the use; once NATS is back the sync (after the reconnect) puts it."""
    settings = Settings(
        nats_url=own_nats_server.url, database_url=sqlite_url, data_dir=data_dir, region="local"
    )
    async with running_api(settings) as api:
        tenant_id, _ = await new_tenant(api, "physics", "ann")
        nc = api.service.nc
        assert nc is not None
        own_nats_server.stop()
        await until(lambda: not nc.is_connected, what="the api saw NATS go")

        put = await _put(api.owner, tenant_id, FULL)
        assert put.status == 503
        assert put.body["error"] == "unavailable"
        assert "the quota is stored" in put.body["message"]
        assert put.body["request_id"] == put.request_id
        assert [r["max_gpus_total"] for r in await _rows(api)] == [8]
        got = await api.owner.get(_path(tenant_id))
        assert got.status == 503
        assert "use" in got.body["message"]

        own_nats_server.start()
        admin = await connect(own_nats_server.url, name="test")
        try:
            bus = Bus(admin, admin.jetstream(), own_nats_server.url)

            async def repaired() -> bool:
                quota = await _on_bus(bus, tenant_id)
                return quota is not None and quota.max_gpus_total == 8

            await eventually(repaired, within_s=30)
        finally:
            await admin.close()


async def test_the_api_identity_may_do_all_of_it_on_a_locked_bus(
    tmp_path: Path, sqlite_url: str, data_dir: Path
) -> None:
    """The api as Solo runs it, with only its permission template (ADR-0009): it puts quotas,
    reads accounting's use, and the sync reads and repairs the `quota.*` keys."""
    credentials = tmp_path / "bus"
    admin_id = identities.ensure_identity(credentials, "admin")
    users = {
        identities.API: (
            identities.ensure_identity(credentials, identities.API),
            identities.service_permissions(identities.API),
        ),
        "admin": (admin_id, identities.Permissions(publish=(">",), subscribe=(">",))),
    }
    server = EmbeddedNats(
        tmp_path / "nats", port=0, authorization=identities.authorization_conf(users)
    )
    server.start()
    try:
        admin = await connect(server.url, name="admin", credentials=admin_id)
        bus = Bus(admin, admin.jetstream(), server.url)
        settings = Settings(
            nats_url=server.url,
            database_url=sqlite_url,
            data_dir=data_dir,
            region="local",
            nats_credentials_dir=credentials,
        )
        try:
            async with running_api(settings) as api:
                sync = await _sync(api)
                tenant_id, _ = await new_tenant(api, "physics", "ann")
                assert (await _put(api.owner, tenant_id, FULL)).status == 200
                assert await _on_bus(bus, tenant_id) is not None
                bucket = await _bucket(bus)
                usage = TenantUsage(tenant_id=tenant_id, open_gpus={"l40s-48gb": 2})
                await bucket.put(names.tenant_usage_key(tenant_id), usage.to_bytes())
                got = await api.owner.get(_path(tenant_id))
                assert got.status == 200, got.text
                assert got.body["use"]["gpus_total"] == 2
                await bucket.delete(names.tenant_quota_key(tenant_id))
                await bucket.put("quota.stray", b"{}")
                report = await sync.run_once()
                assert (report.put, report.deleted) == ((tenant_id,), ("quota.stray",))
                assert await _on_bus(bus, tenant_id) is not None
        finally:
            await admin.close()
    finally:
        server.stop()
