"""KV access that works under an agent's narrow permissions.

An agent may not call `js.key_value()` (its stream-info call can list every key) nor nats-py's
`kv.watch` (it creates consumers through the unfiltered API). It binds the bucket directly and
watches its one key through an ordered consumer with a pinned name and a filter subject.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.kv import KeyValue

from einsora.common.bus.names import BucketName


def bind_bucket(js: JetStreamContext, bucket: BucketName) -> KeyValue:
    """A KeyValue bound without a stream-info call, reading with direct gets."""
    return KeyValue(
        name=bucket.name, stream=bucket.stream, pre=bucket.subject_prefix, js=js, direct=True
    )


async def watch_key(
    js: JetStreamContext, bucket: BucketName, key: str, consumer_name: str
) -> JetStreamContext.PushSubscription:
    """An ordered push subscription on one key, starting with its latest value.

    The consumer is created with a pinned name and a filter subject, the one form Lab's
    per-machine permissions allow.
    """
    return await js.subscribe(
        bucket.key_subject(key),
        stream=bucket.stream,
        ordered_consumer=True,
        config=ConsumerConfig(name=consumer_name),
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
    )
