"""The bus against a real nats-server: provisioning, de-duplication, KV watches, restarts."""

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.js.errors import APIError

from einsora.common.bus import bind_bucket, connect, names, provision, publish, watch_key
from einsora.common.bus.provision import stream_configs
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.errors import BusUnavailable, PortInUse
from einsora.common.schemas import EventKind, WorkloadEvent, WorkloadState
from einsora.common.testing import Bus


def _event(event_id: str, seq: int = 0) -> WorkloadEvent:
    return WorkloadEvent(
        event_id=event_id,
        workload_id="w-1",
        tenant_id="t-1",
        kind=EventKind.note,
        state=WorkloadState.queued,
        reason="no machine fits",
        seq=seq,
    )


async def test_provisioning_twice_changes_nothing(bus: Bus) -> None:
    report = await provision(bus.js)
    assert report.created == ()
    assert report.updated == ()
    assert set(report.unchanged) == {c.name for c in stream_configs()}


async def test_a_changed_setting_is_updated_in_place(bus: Bus) -> None:
    await publish(
        bus.js, names.event_subject("w-1"), _event("ev-keep"), request_id="r", msg_id="ev-keep"
    )
    info = await bus.js.stream_info(names.EVENTS.name)
    changed = StreamConfig.from_response(info.config.as_dict())
    changed.max_age = 3600.0
    await bus.js.update_stream(changed)

    report = await provision(bus.js)

    assert report.updated == (names.EVENTS.name,)
    info = await bus.js.stream_info(names.EVENTS.name)
    assert info.config.max_age == 30 * 24 * 3600
    assert info.state.messages == 1  # updated in place, not recreated


async def test_machines_bucket_is_declared_for_untrusted_agents(bus: Bus) -> None:
    info = await bus.js.stream_info(names.MACHINES.stream)
    assert info.config.max_consumers is not None
    assert info.config.max_consumers >= 10_000  # one watch per machine
    assert info.config.allow_rollup_hdrs is False
    assert info.config.allow_direct is True
    assert info.config.max_msg_size == names.MACHINES.max_value_size


async def test_a_duplicate_msg_id_is_dropped(bus: Bus) -> None:
    subject = names.event_subject("w-1")
    first = await publish(bus.js, subject, _event("ev-1"), request_id="req-1", msg_id="ev-1")
    again = await publish(bus.js, subject, _event("ev-1"), request_id="req-1", msg_id="ev-1")
    other = await publish(bus.js, subject, _event("ev-2"), request_id="req-1", msg_id="ev-2")

    assert not first.duplicate
    assert again.duplicate
    assert not other.duplicate
    info = await bus.js.stream_info(names.EVENTS.name)
    assert info.state.messages == 2


async def test_messages_carry_request_id_and_traceparent(bus: Bus) -> None:
    subject = names.event_subject("w-9")
    await publish(bus.js, subject, _event("ev-9"), request_id="req-abc", msg_id="ev-9")
    sub = await bus.js.pull_subscribe(subject, stream=names.EVENTS.name)
    [msg] = await sub.fetch(1, timeout=2)
    assert msg.headers is not None
    assert msg.headers[names.REQUEST_ID_HEADER] == "req-abc"
    assert msg.headers[names.TRACEPARENT_HEADER].startswith("00-")
    assert WorkloadEvent.from_bytes(msg.data).event_id == "ev-9"


async def test_a_kv_watcher_on_one_key_sees_a_put(bus: Bus) -> None:
    kv = bind_bucket(bus.js, names.MACHINES)
    key = names.desired_key("m-1")
    sub = await watch_key(bus.js, names.MACHINES, key, names.desired_watch_consumer("m-1"))
    await kv.put(names.desired_key("m-2"), b"someone else's")
    await kv.put(key, b"generation 1")
    msg = await sub.next_msg(timeout=2)
    assert msg.data == b"generation 1"
    assert msg.subject == names.MACHINES.key_subject(key)
    await sub.unsubscribe()


async def test_kv_refuses_a_rollup_that_would_purge_other_machines(bus: Bus) -> None:
    kv = bind_bucket(bus.js, names.MACHINES)
    await kv.put(names.observed_key("m-1"), b"m-1")
    with pytest.raises(APIError):
        await bus.js.publish(
            names.MACHINES.key_subject(names.observed_key("m-2")),
            b"x",
            headers={"Nats-Rollup": "all"},
        )
    assert (await kv.get(names.observed_key("m-1"))).value == b"m-1"


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_a_durable_consumer_survives_a_server_restart(
    own_nats_server: EmbeddedNats, how: str
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    sub = await js.pull_subscribe(
        names.EVENTS_FILTER,
        durable="restart-test",
        stream=names.EVENTS.name,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
    )
    await publish(js, names.event_subject("w-1"), _event("ev-1"), request_id="r", msg_id="ev-1")
    [msg] = await sub.fetch(1, timeout=2)
    await msg.ack_sync()

    if how == "kill":
        own_nats_server.kill()  # a crash, not a clean stop
    else:
        own_nats_server.stop()
    own_nats_server.start()

    await asyncio.wait_for(_until_connected(nc), timeout=10)
    await publish(js, names.event_subject("w-1"), _event("ev-2", 1), request_id="r", msg_id="ev-2")
    seen = []
    while "ev-2" not in seen:
        [msg] = await sub.fetch(1, timeout=5)
        seen.append(WorkloadEvent.from_bytes(msg.data).event_id)
        await msg.ack_sync()
    if how == "stop":
        assert seen == ["ev-2"]  # the ack of ev-1 was kept
    else:
        # After a crash the consumer's last ack may be replayed (at-least-once delivery): that
        # is why every consumer is idempotent. Nothing is lost and nothing else comes back.
        assert seen in (["ev-2"], ["ev-1", "ev-2"])
    await nc.close()


async def _until_connected(nc: NATS) -> None:
    """The client reconnects by itself; wait (bounded by the caller) until it has."""
    never = asyncio.Event()
    while not nc.is_connected:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(never.wait(), 0.02)


async def test_connect_names_the_url_when_nats_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"nats://127.0.0.1:{port}"
    with pytest.raises(BusUnavailable, match=url):
        await connect(url, name="test", startup_timeout=0.5)


def test_embedded_nats_refuses_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = EmbeddedNats(tmp_path, port=port)
        with pytest.raises(PortInUse, match=f"port {port}.*--nats-port"):
            server.start()
    assert not server.running


def test_embedded_nats_syncs_always(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path, port=0) as server:
        assert "sync_interval: always" in server.config_file.read_text()
        assert server.port > 0
    assert not server.running


@pytest.mark.parametrize("bad", ["a.b", "*", ">", "w 1", ""])
def test_subject_tokens_cannot_change_a_subjects_shape(bad: str) -> None:
    with pytest.raises(ValueError, match="subject token"):
        names.event_subject(bad)


async def test_more_than_a_thousand_agents_can_watch_their_keys(
    own_nats_server: EmbeddedNats,
) -> None:
    nc = await connect(own_nats_server.url, name="test")
    js = nc.jetstream()
    await provision(js)
    for i in range(1010):  # the server's default cap is 1,000 consumers per stream
        machine = f"m-{i:05d}"
        await watch_key(
            js, names.MACHINES, names.desired_key(machine), names.desired_watch_consumer(machine)
        )
    info = await js.stream_info(names.MACHINES.stream)
    assert info.state.consumer_count == 1010
    await nc.close()
