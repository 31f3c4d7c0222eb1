"""KvMirror against a real nats-server: initial values, changes, restarts and drift."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from einsora.common.bus import KvMirror, ShortRead, check_whole, connect, key_count, names
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.testing import Bus, until
from einsora.common.transient import is_transient

# A bucket of the test's own, made as any KV client makes one (rollups allowed, so that
# `kv.purge` works; Einsora's own buckets refuse rollups).
BUCKET = names.BucketName("mirror-test", "KvMirror's tests", 64 * 1024, allow_rollup=True)


async def _ensure_bucket(js: JetStreamContext) -> None:
    await js.create_key_value(KeyValueConfig(bucket=BUCKET.name, history=5))


@dataclass
class Copy:
    """What a mirror's callbacks were told: the values it holds, and every deletion."""

    values: dict[str, bytes] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    synced: int = 0

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def delete(self, key: str) -> None:
        self.values.pop(key, None)
        self.deleted.append(key)

    def on_synced(self) -> None:
        self.synced += 1


@dataclass
class Mirrored:
    copy: Copy
    mirror: KvMirror
    kv: KeyValue


@pytest_asyncio.fixture
async def fresh(bus: Bus) -> Bus:
    """The session's server with an empty test bucket."""
    with contextlib.suppress(NotFoundError):
        await bus.js.delete_key_value(BUCKET.name)
    await _ensure_bucket(bus.js)
    return bus


@pytest_asyncio.fixture
async def mirrors() -> AsyncIterator[list[KvMirror]]:
    started: list[KvMirror] = []
    yield started
    for mirror in started:
        await mirror.stop()


async def _mirror(
    nc: NATS, js: JetStreamContext, started: list[KvMirror], **options: object
) -> Mirrored:
    copy = Copy()

    async def ensure() -> None:
        await _ensure_bucket(js)

    mirror = KvMirror(
        nc,
        js,
        BUCKET,
        on_put=copy.put,
        on_delete=copy.delete,
        on_synced=copy.on_synced,
        ensure=ensure,
        retry_s=0.2,
        **options,  # type: ignore[arg-type]
    )
    started.append(mirror)
    await mirror.start()
    return Mirrored(copy, mirror, await js.key_value(BUCKET.name))


async def test_start_returns_with_the_current_values(fresh: Bus, mirrors: list[KvMirror]) -> None:
    kv = await fresh.js.key_value(BUCKET.name)
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    await kv.put("b", b"3")
    await kv.put("gone", b"x")
    await kv.delete("gone")

    m = await _mirror(fresh.nc, fresh.js, mirrors)

    assert m.copy.values == {"a": b"1", "b": b"3"}
    assert m.mirror.keys() == {"a", "b"}
    assert m.copy.synced == 1


async def test_an_empty_bucket_syncs(fresh: Bus, mirrors: list[KvMirror]) -> None:
    m = await _mirror(fresh.nc, fresh.js, mirrors)
    assert m.copy.values == {}
    assert m.copy.synced == 1


async def test_puts_deletes_and_purges_are_delivered(fresh: Bus, mirrors: list[KvMirror]) -> None:
    m = await _mirror(fresh.nc, fresh.js, mirrors)

    await m.kv.put("a", b"1")
    await m.kv.put("b", b"2")
    await until(lambda: m.copy.values == {"a": b"1", "b": b"2"})
    await m.kv.put("a", b"changed")
    await until(lambda: m.copy.values.get("a") == b"changed")

    await m.kv.delete("a")
    await until(lambda: "a" in m.copy.deleted)
    await m.kv.purge("b")
    await until(lambda: "b" in m.copy.deleted)
    assert m.copy.values == {}
    assert m.mirror.keys() == set()


async def test_only_the_keys_asked_for_are_mirrored(fresh: Bus, mirrors: list[KvMirror]) -> None:
    kv = await fresh.js.key_value(BUCKET.name)
    await kv.put("m-1.inventory", b"i")
    await kv.put("m-1.desired", b"d")
    m = await _mirror(fresh.nc, fresh.js, mirrors, keys=("*.inventory",))
    await kv.put("m-2.inventory", b"j")
    await kv.put("m-2.desired", b"e")
    await until(lambda: "m-2.inventory" in m.copy.values)
    assert set(m.copy.values) == {"m-1.inventory", "m-2.inventory"}


async def test_a_failing_callback_does_not_stop_the_mirror(
    fresh: Bus, mirrors: list[KvMirror]
) -> None:
    copy = Copy()

    def put(key: str, value: bytes) -> None:
        if key == "bad":
            raise RuntimeError("a bug in a caller")
        copy.put(key, value)

    mirror = KvMirror(fresh.nc, fresh.js, BUCKET, on_put=put, on_delete=copy.delete)
    mirrors.append(mirror)
    await mirror.start()
    kv = await fresh.js.key_value(BUCKET.name)
    await kv.put("bad", b"1")
    await kv.put("good", b"2")
    await until(lambda: "good" in copy.values)


@pytest.mark.parametrize("store", ["kept", "lost"])
async def test_the_mirror_follows_the_bucket_across_a_server_restart(
    own_nats_server: EmbeddedNats, mirrors: list[KvMirror], store: str
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await _ensure_bucket(js)
    kv = await js.key_value(BUCKET.name)
    await kv.put("before", b"1")
    await kv.put("stays", b"2")
    m = await _mirror(nc, js, mirrors)
    assert set(m.copy.values) == {"before", "stays"}

    own_nats_server.stop()
    if store == "lost":
        shutil.rmtree(own_nats_server.data_dir / "jetstream")
    own_nats_server.start()
    # The mirror re-reads after the reconnect (and provisions the bucket a lost store lacks).
    await until(lambda: m.copy.synced >= 2)
    kv = await js.key_value(BUCKET.name)
    await kv.put("after", b"3")
    await until(lambda: "after" in m.copy.values)
    await kv.delete("after")
    await until(lambda: "after" in m.copy.deleted)

    if store == "lost":
        # Every key the restarted server no longer has is delivered as a deletion.
        assert {"before", "stays"} <= set(m.copy.deleted)
        assert m.copy.values == {}
    else:
        assert m.copy.values == {"before": b"1", "stays": b"2"}
    await nc.close()


async def test_the_audit_repairs_a_change_the_watch_missed(
    fresh: Bus, mirrors: list[KvMirror]
) -> None:
    kv = await fresh.js.key_value(BUCKET.name)
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    m = await _mirror(fresh.nc, fresh.js, mirrors, audit_s=0.5)
    # Purging a subject from the stream (an operator's repair, a limit) sends no delete
    # marker: a watch never hears of it; only a re-read does.
    await fresh.js.purge_stream(BUCKET.stream, subject=BUCKET.key_subject("a"))
    await until(lambda: "a" in m.copy.deleted)
    assert m.copy.values == {"b": b"2"}
    # The mirror keeps following after its audit.
    await kv.put("c", b"3")
    await until(lambda: m.copy.values.get("c") == b"3")


async def test_a_whole_read_is_told_from_a_short_one(fresh: Bus) -> None:
    """nats-py's watch can end its initial values early (nats.py#842): a read is checked
    against how many keys the bucket's stream holds, delete markers included, and a short one
    is a transient failure that the mirror and the scheduler's watch read again after."""
    kv = await fresh.js.key_value(BUCKET.name)
    for key in ("a.1", "a.2", "b.1"):
        await kv.put(key, b"x")
    await kv.delete("a.2")  # a marker: still a message for the key
    assert await key_count(fresh.js, BUCKET) == 3
    assert await key_count(fresh.js, BUCKET, "a.*") == 2
    check_whole(BUCKET, 3, 3)
    with pytest.raises(ShortRead) as short:
        check_whole(BUCKET, 0, 3)
    assert "read 0 of the 3 keys of the mirror-test bucket" in str(short.value)
    assert is_transient(short.value)
