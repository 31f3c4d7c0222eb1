"""Gateway keys: shown once, stored and published only as a hash, revoked off the bus at once,
seen only by their owner and the tenant's admins; and the bucket the gateway reads is put right
by the sync whatever was done to it."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from einsora.api.projections.gateway_keys import GatewayKeysSync
from einsora.api.testing import (
    Client,
    RunningApi,
    eventually,
    new_member,
    new_tenant,
    running_api,
)
from einsora.common.bus import connect, identities, names
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.ids import new_id
from einsora.common.schemas import CountSource, GatewayKey, TokenUsage
from einsora.common.settings import Settings
from einsora.common.testing import Bus, until

KEYS = "/v1/gateway/keys"


async def _bucket(bus: Bus) -> KeyValue:
    return await bus.js.key_value(names.GATEWAY_KEYS.name)


async def _published(bus: Bus, key_id: str) -> GatewayKey | None:
    """What the gateway would read for this key now (None: nothing)."""
    try:
        entry = await (await _bucket(bus)).get(names.gateway_key_key(key_id))
    except KeyNotFoundError:  # never written, or deleted
        return None
    return GatewayKey.from_bytes(entry.value or b"")


async def _rows(api: RunningApi) -> list[dict[str, Any]]:
    assert api.service.store is not None
    async with api.service.store.read() as conn:
        rows = (await conn.execute(sa.text("SELECT * FROM gateway_keys"))).mappings().all()
    return [dict(r) for r in rows]


async def _sync(api: RunningApi) -> GatewayKeysSync:
    """The api's sync, once its first pass (at start, in the background) is done: the passes
    a test runs are then the only ones before the next period."""
    sync = api.service.gateway_keys
    assert sync is not None
    await until(lambda: sync.passes >= 1, what="the first pass of the gateway keys sync")
    return sync


async def _make(client: Client, name: str = "ci", **fields: Any) -> dict[str, Any]:
    made = await client.post(KEYS, {"name": name, **fields})
    assert made.status == 201, made.text
    body: dict[str, Any] = made.body
    return body


async def test_a_key_is_shown_once_and_the_gateway_gets_only_its_hash(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    made = await api.owner.post(
        KEYS,
        {
            "name": "notebook",
            "models": ["llama", "qwen", "llama"],
            "rpm": 60,
            "tpm": 10_000,
            "max_tokens_default": 256,
            "expires_in_days": 30,
        },
    )
    assert made.status == 201, made.text
    body = made.body
    key = body["key"]
    assert key.startswith("esk_")
    assert len(key) >= len("esk_") + 43  # 32 random bytes, base64url
    assert set(body) == {
        "id",
        "name",
        "key",
        "models",
        "rpm",
        "tpm",
        "max_tokens_default",
        "expires_at",
        "created_at",
    }
    assert body["models"] == ["llama", "qwen"]
    assert (body["rpm"], body["tpm"], body["max_tokens_default"]) == (60, 10_000, 256)
    expires = datetime.fromisoformat(body["expires_at"])
    assert timedelta(days=29) < expires - datetime.now(UTC) <= timedelta(days=30)

    # On the bus before the 201 came back: no waiting here.
    published = await _published(bus, body["id"])
    assert published is not None
    digest = hashlib.sha256(key.encode()).hexdigest()
    me = (await api.owner.get("/v1/me")).body
    assert published.key_hash == digest
    assert (published.tenant_id, published.user_id) == (me["tenant"]["id"], me["user"]["id"])
    assert published.models == ["llama", "qwen"]
    assert (published.rpm, published.tpm, published.max_tokens_default) == (60, 10_000, 256)
    assert published.expires_at == expires
    raw = (await (await _bucket(bus)).get(names.gateway_key_key(body["id"]))).value or b""
    assert key.encode() not in raw

    # The store has the hash and never the key.
    [row] = await _rows(api)
    assert row["key_sha256"] == digest
    assert all(key not in str(value) for value in row.values())


async def test_list_and_show_never_give_the_key_or_its_hash(api: RunningApi) -> None:
    made = await _make(api.owner, "laptop")
    key = made["key"]
    digest = hashlib.sha256(key.encode()).hexdigest()
    listed = await api.owner.get(KEYS)
    assert listed.status == 200
    assert [k["id"] for k in listed.body["items"]] == [made["id"]]
    shown = await api.owner.get(f"{KEYS}/{made['id']}")
    assert shown.status == 200
    for answer in (listed, shown):
        assert key not in answer.text
        assert digest not in answer.text
    assert "key" not in shown.body
    assert shown.body["name"] == "laptop"
    assert shown.body["models"] is None  # every endpoint of the tenant
    assert shown.body["max_tokens_default"] == 1024


async def test_a_list_pages_like_every_other(api: RunningApi) -> None:
    made = [(await _make(api.owner, f"k{i}"))["id"] for i in range(5)]
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2"} if cursor is None else {"limit": "2", "cursor": cursor}
        page = await api.owner.get(KEYS, params=params)
        assert page.status == 200
        seen += [k["id"] for k in page.body["items"]]
        cursor = page.body["next_cursor"]
        if cursor is None:
            break
    assert seen == made


async def test_a_revoked_key_leaves_the_bus_before_the_answer(
    api_on_store: RunningApi, bus: Bus
) -> None:
    api = api_on_store
    made = await _make(api.owner)
    assert await _published(bus, made["id"]) is not None
    revoked = await api.owner.delete(f"{KEYS}/{made['id']}")
    assert revoked.status == 204
    assert await _published(bus, made["id"]) is None
    for again in (
        await api.owner.delete(f"{KEYS}/{made['id']}"),
        await api.owner.get(f"{KEYS}/{made['id']}"),
    ):
        assert again.status == 404
        assert again.body["error"] == "not_found"
        assert again.body["request_id"] == again.request_id
    assert (await api.owner.get(KEYS)).body["items"] == []
    [row] = await _rows(api)
    assert row["revoked_at"] is not None


async def test_another_tenants_key_answers_404(api: RunningApi, bus: Bus) -> None:
    _, victim = await new_tenant(api, "victim", "victim-admin")
    _, intruder = await new_tenant(api, "intruder", "intruder-admin")
    made = await _make(victim, "victim's")
    for answer in (
        await intruder.get(f"{KEYS}/{made['id']}"),
        await intruder.delete(f"{KEYS}/{made['id']}"),
    ):
        assert answer.status == 404
        assert answer.body["request_id"] == answer.request_id
    assert (await intruder.get(KEYS)).body["items"] == []
    assert await _published(bus, made["id"]) is not None  # still the victim's, and live
    assert (await victim.get(f"{KEYS}/{made['id']}")).status == 200


async def test_a_member_sees_their_own_keys_and_an_admin_every_key(api: RunningApi) -> None:
    tenant_id, admin = await new_tenant(api, "lab", "lab-admin")
    alice = await new_member(api, tenant_id, "alice")
    bob = await new_member(api, tenant_id, "bob")
    alices = await _make(alice, "alice's")
    bobs = await _make(bob, "bob's")
    alice_id = (await alice.get("/v1/me")).body["user"]["id"]

    assert [k["id"] for k in (await alice.get(KEYS)).body["items"]] == [alices["id"]]
    assert (await bob.get(f"{KEYS}/{alices['id']}")).status == 404
    assert (await bob.delete(f"{KEYS}/{alices['id']}")).status == 404
    assert (await alice.get(f"{KEYS}/{alices['id']}")).status == 200  # bob could not revoke it

    everyone = (await admin.get(KEYS)).body["items"]
    assert [k["id"] for k in everyone] == [alices["id"], bobs["id"]]
    shown = await admin.get(f"{KEYS}/{alices['id']}")
    assert shown.status == 200
    assert shown.body["user_id"] == alice_id
    assert (await admin.delete(f"{KEYS}/{bobs['id']}")).status == 204
    assert (await bob.get(KEYS)).body["items"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "k", "rpm": 0}, "rpm"),
        ({"name": "k", "tpm": -5}, "tpm"),
        ({"name": "k", "rpm": "60"}, "rpm"),  # strict: a string is not a number
        ({"name": "k", "scope": "all"}, "scope"),  # an unknown field is named, never ignored
        ({"name": "x" * 100_000}, "name"),
        ({"name": "line\u2028break"}, "name"),
        ({}, "name"),
        ({"name": "k", "models": []}, "models"),
        ({"name": "k", "models": [f"m{i}" for i in range(65)]}, "models"),
        ({"name": "k", "models": ["a\x1b[31m"]}, "models.0"),
        ({"name": "k", "max_tokens_default": 0}, "max_tokens_default"),
        ({"name": "k", "max_tokens_default": 1_000_001}, "max_tokens_default"),
        ({"name": "k", "expires_in_days": 0}, "expires_in_days"),
        ({"name": "k", "expires_in_days": 3651}, "expires_in_days"),
    ],
)
async def test_a_bad_body_is_refused_naming_the_field(
    api: RunningApi, body: dict[str, Any], field: str
) -> None:
    answer = await api.owner.post(KEYS, body)
    assert answer.status == 422, answer.text
    assert answer.body["error"] == "validation_error"
    assert [d["field"] for d in answer.body["details"]] == [field]
    assert field in answer.body["message"]
    assert answer.body["request_id"] == answer.request_id
    assert await _rows(api) == []


async def test_the_sync_puts_back_what_is_missing_or_wrong_and_deletes_strays(
    api: RunningApi, bus: Bus
) -> None:
    sync = await _sync(api)
    kept = await _make(api.owner, "kept")
    lost = await _make(api.owner, "lost")
    altered = await _make(api.owner, "altered", rpm=10)
    revoked = await _make(api.owner, "revoked")
    expected = {k["id"]: await _published(bus, k["id"]) for k in (kept, lost, altered)}
    assert (await api.owner.delete(f"{KEYS}/{revoked['id']}")).status == 204
    # From here the test runs the passes itself: a pass of the loop (asked for by a put that
    # timed out on a loaded machine) would repair some of what it breaks before it looks.
    await sync.stop()

    bucket = await _bucket(bus)
    await bucket.delete(names.gateway_key_key(lost["id"]))
    wrong = expected[altered["id"]]
    assert wrong is not None
    await bucket.put(
        names.gateway_key_key(altered["id"]), wrong.model_copy(update={"rpm": 10**6}).to_bytes()
    )
    # A revoked key written back, one the store never had, and a value that is not a key.
    stray = GatewayKey(
        key_id=new_id("gateway_key"),
        tenant_id="t-x",
        user_id="u-x",
        name="stray",
        key_hash="0" * 64,
    )
    came_back = wrong.model_copy(update={"key_id": revoked["id"], "name": "revoked"})
    await bucket.put(names.gateway_key_key(revoked["id"]), came_back.to_bytes())
    await bucket.put(names.gateway_key_key(stray.key_id), stray.to_bytes())
    await bucket.put("garbage", b"not json")

    report = await sync.run_once()
    assert sorted(report.put) == sorted([lost["id"], altered["id"]])
    assert sorted(report.deleted) == sorted(["garbage", revoked["id"], stray.key_id])
    for key_id, value in expected.items():
        assert await _published(bus, key_id) == value
    assert await _published(bus, revoked["id"]) is None
    assert await _published(bus, stray.key_id) is None

    again = await sync.run_once()  # nothing left to repair
    assert (again.put, again.deleted) == ((), ())


async def test_an_expired_key_leaves_the_bus_on_the_next_pass(api: RunningApi, bus: Bus) -> None:
    short = await _make(api.owner, "short", expires_in_days=1)
    forever = await _make(api.owner, "forever")
    assert await _published(bus, short["id"]) is not None
    api.service.clock = lambda: datetime.now(UTC) + timedelta(days=1, seconds=1)  # a day passes
    report = await (await _sync(api)).run_once()
    assert report.deleted == (short["id"],)
    assert await _published(bus, short["id"]) is None
    assert await _published(bus, forever["id"]) is not None


async def test_a_late_put_never_brings_a_revoked_key_back(api: RunningApi, bus: Bus) -> None:
    """A route's put that arrives after the key's revocation (its unit committed, then the
    revocation overtook it on the bus) is refused: the bucket keeps the deletion."""
    made = await _make(api.owner)
    published = await _published(bus, made["id"])
    assert published is not None
    assert (await api.owner.delete(f"{KEYS}/{made['id']}")).status == 204
    await (await _sync(api)).published(published)
    assert await _published(bus, made["id"]) is None


async def test_an_outage_is_put_right_once_the_bus_is_back(
    own_nats_server: EmbeddedNats, sqlite_url: str, data_dir: Path
) -> None:
    """With NATS down, a revocation answers 503 saying the gateway was not told, a new key is
    still made; once NATS is back the sync (after the reconnect) removes the one, puts the
    other."""
    settings = Settings(
        nats_url=own_nats_server.url, database_url=sqlite_url, data_dir=data_dir, region="local"
    )
    async with running_api(settings) as api:
        before = await _make(api.owner, "before")
        nc = api.service.nc
        assert nc is not None
        own_nats_server.stop()
        await until(lambda: not nc.is_connected, what="the api saw NATS go")

        revoked = await api.owner.delete(f"{KEYS}/{before['id']}")
        assert revoked.status == 503
        assert revoked.body["error"] == "unavailable"
        assert "the key is revoked" in revoked.body["message"]
        assert revoked.body["request_id"] == revoked.request_id
        assert (await api.owner.get(f"{KEYS}/{before['id']}")).status == 404
        during = await _make(api.owner, "during")

        own_nats_server.start()
        admin = await connect(own_nats_server.url, name="test")
        try:
            bus = Bus(admin, admin.jetstream(), own_nats_server.url)

            async def repaired() -> bool:
                gone = await _published(bus, before["id"]) is None
                return gone and await _published(bus, during["id"]) is not None

            await eventually(repaired, within_s=30)
        finally:
            await admin.close()


async def test_the_api_identity_may_do_all_of_it_on_a_locked_bus(
    tmp_path: Path, sqlite_url: str, data_dir: Path
) -> None:
    """The api as Solo runs it, with its own nkey and only its permission template (ADR-0009):
    it puts and deletes keys, and the sync reads the bucket and repairs it."""
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
                kept = await _make(api.owner, "kept")
                gone = await _make(api.owner, "gone")
                assert await _published(bus, kept["id"]) is not None
                assert (await api.owner.delete(f"{KEYS}/{gone['id']}")).status == 204
                assert await _published(bus, gone["id"]) is None
                bucket = await _bucket(bus)
                await bucket.delete(names.gateway_key_key(kept["id"]))
                await bucket.put("stray", b"{}")
                report = await sync.run_once()
                assert (report.put, report.deleted) == ((kept["id"],), ("stray",))
                assert await _published(bus, kept["id"]) is not None
        finally:
            await admin.close()
    finally:
        server.stop()


async def test_a_keys_last_use_follows_the_gateways_counts(api: RunningApi, bus: Bus) -> None:
    made = await api.owner.post(KEYS, {"name": "app"})
    assert made.status == 201
    key_id = made.body["id"]
    assert (await api.owner.get(f"{KEYS}/{key_id}")).body["last_used_at"] is None
    tenant_id = (await api.owner.get("/v1/me")).body["tenant"]["id"]
    used_at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    async def count(at: datetime, tenant: str = tenant_id, subject_tenant: str = tenant_id) -> None:
        usage = TokenUsage(
            request_id=new_id("request"),
            tenant_id=tenant,
            key_id=key_id,
            endpoint="w-x",
            model="chat",
            prompt_tokens=3,
            completion_tokens=5,
            source=CountSource.upstream,
            at=at,
        )
        await bus.js.publish(names.usage_tokens_subject(subject_tenant), usage.to_bytes())

    await count(used_at)

    async def seen(at: datetime) -> bool:
        shown = await api.owner.get(f"{KEYS}/{key_id}")
        return bool(shown.body["last_used_at"] == at.isoformat().replace("+00:00", "Z"))

    await eventually(lambda: seen(used_at))
    # An older count (redelivered, or late) never moves it back; one of another tenant, or on
    # another tenant's subject, never touches it.
    await count(used_at - timedelta(hours=1))
    await count(used_at + timedelta(hours=2), subject_tenant="t-other")
    await count(used_at + timedelta(hours=3), tenant="t-other", subject_tenant="t-other")
    await count(used_at + timedelta(minutes=5))
    await eventually(lambda: seen(used_at + timedelta(minutes=5)))
    listed = (await api.owner.get(KEYS)).body["items"]
    assert listed[0]["last_used_at"] == "2026-12-01T12:05:00Z"
