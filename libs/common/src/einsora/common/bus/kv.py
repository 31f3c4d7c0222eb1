"""KV access that works under an agent's narrow permissions.

An agent may not call `js.key_value()` (its stream-info call can list every key) nor nats-py's
`kv.watch` (it creates consumers through the unfiltered API). It binds the bucket directly and
watches its one key with a plain subscription (`key_subscription`, ADR-0028).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from pydantic import ValidationError

from einsora.common.bus.names import BucketName
from einsora.common.failures import outlived
from einsora.common.schemas.base import Message

M = TypeVar("M", bound=Message)

READ_TIMEOUT_S = 10.0
"""The longest wait for the next key of a bucket read."""


def bind_bucket(js: JetStreamContext, bucket: BucketName) -> KeyValue:
    """A KeyValue bound without a stream-info call, reading with direct gets."""
    return KeyValue(
        name=bucket.name, stream=bucket.stream, pre=bucket.subject_prefix, js=js, direct=True
    )


async def watch_key(
    js: JetStreamContext, bucket: BucketName, key: str, consumer_name: str
) -> JetStreamContext.PushSubscription:
    """An ordered push subscription on one key, starting with its latest value.

    The consumer is created with a pinned name and a filter subject. For trusted clients: a
    machine creates no consumer (ADR-0028).
    """
    return await js.subscribe(
        bucket.key_subject(key),
        stream=bucket.stream,
        ordered_consumer=True,
        config=ConsumerConfig(name=consumer_name),
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
    )


@dataclass(frozen=True, slots=True)
class KeyState:
    """A key as a read of its bucket found it."""

    revision: int
    value: bytes | None
    """None: a delete marker."""


class ShortRead(ConnectionError):
    """A read of a bucket delivered fewer keys than its stream holds: nats-py's watch can send
    its "initial values done" marker before the initial values are all in (nats.py#842, #995:
    seen on a 3-node cluster, where a new leader read 0 of 12 keys). Transient, as a cut
    connection is (`transient.is_transient`): read again."""


async def key_count(js: JetStreamContext, bucket: BucketName, keys: str = ">") -> int:
    """How many keys matching `keys` the bucket's stream holds a message for, delete markers
    included: what a whole read of them delivers at least (a key written meanwhile only adds)."""
    info = await js.stream_info(bucket.stream, subjects_filter=bucket.subject_prefix + keys)
    return len(info.state.subjects or {})


def check_whole(bucket: BucketName, read: int, expected: int) -> None:
    """Raise ShortRead when a read delivered fewer keys than `key_count` found before it."""
    if read < expected:
        raise ShortRead(
            f"read {read} of the {expected} keys of the {bucket.name} bucket (the watch ended "
            "early); reading it again"
        )


async def read_bucket(
    kv: KeyValue, keys: str = ">", *, timeout_s: float = READ_TIMEOUT_S
) -> dict[str, KeyState]:
    """Every key matching `keys`, with its latest revision and value, deleted ones included:
    one watch read up to nats-py's "initial values done" marker, then stopped."""
    watcher = await kv.watch(keys)
    try:
        found: dict[str, KeyState] = {}
        while True:
            entry = await watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
            if entry is None:  # nats-py's "initial values done" marker
                return found
            deleted = entry.operation in (KV_DEL, KV_PURGE)
            found[entry.key] = KeyState(
                entry.revision or 0, None if deleted else (entry.value or b"")
            )
    finally:
        with outlived(nats.errors.Error):
            await watcher.stop()  # type: ignore[no-untyped-call]


async def read_records(
    kv: KeyValue, model: type[M], keys: str = ">", *, timeout_s: float = READ_TIMEOUT_S
) -> dict[str, M | None]:
    """Every live key matching `keys` with its record; None where it does not parse."""
    found: dict[str, M | None] = {}
    for key, state in (await read_bucket(kv, keys, timeout_s=timeout_s)).items():
        if state.value is None:
            continue
        try:
            found[key] = model.from_bytes(state.value)
        except ValidationError:
            found[key] = None
    return found
